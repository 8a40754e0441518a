"""The tool's lowest layer: what every other layer shares (byte counts, error kinds); it imports nothing of the tool."""
