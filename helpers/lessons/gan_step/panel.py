"""The GAN step lab: a panel that builds a step from four switches and shows its verdict live."""

from __future__ import annotations

import html

import ipywidgets as widgets

from backward_twice.common.units import format_bytes
from helpers.display import Table
from helpers.lessons.gan_step.checker import GanStepChecker, StepCheck, _bytes_or_dash
from helpers.lessons.gan_step.steps import SRGAN_SETTINGS, StepSettings, make_step
from helpers.panels import Panel

__all__ = ["GanLab"]

_CARD = "background:#ffffff;color:#1f1f1f;padding:1px 6px"

# (key, label, tooltip) of each figure the panel shows for the last step it ran.
_FIGURES = (
    ("d-grad", "D gradient vs reference", "What optimizerD.step() received, against D's reference gradient"),
    ("g-grad", "G gradient vs reference", "What optimizerG.step() received, against G's reference gradient"),
    ("peak-bytes", "peak graph-only bytes", "Most bytes only the graphs kept alive during the step (meter)"),
    ("held-bytes", "held at optimizerD.step()", "Graph-only bytes alive when optimizerD.step() was called"),
    ("seconds", "time of this step", "Wall time of this one run (noisy)"),
)


class GanLab(Panel):
    """A panel that builds a GAN step from four switches, runs it through a :class:`GanStepChecker`
    and shows the verdict (error, silently wrong, correct) with the meter's figures.

    The switches: ``retain_graph`` on ``d_loss.backward()``, ``fake.detach()`` for D's fake term,
    a fresh ``netD(fake)`` pass for ``g_loss`` (instead of reusing ``fake_out``), and whether
    ``optimizerD.step()`` comes before or after ``g_loss.backward()``. The code that runs is shown
    beside them. Drive it by clicking, or from Python: ``lab.retain.value = True``,
    ``lab.order.value = 'after'``, ``lab.run_button.click()``, ``lab.run_all_button.click()``.

    Used by notebook 03_gan_step.
    """

    def __init__(self, checker: GanStepChecker, title: str = "GAN step lab") -> None:
        if not isinstance(checker, GanStepChecker):
            raise TypeError(f"GanLab needs a GanStepChecker, not {type(checker).__name__}.")
        self.checker = checker
        self.results: dict[StepSettings, StepCheck] = {}
        self.last_check: StepCheck | None = None
        self.last_error: str | None = None
        self.message = ""
        self._build_widgets(title)
        self._show_code()
        self._set_status("Choose the switches, then press Run one step.")

    # -- widgets ---------------------------------------------------------------------------
    def _build_widgets(self, title: str) -> None:
        self.retain = self._checkbox(
            "retain_graph=True on d_loss.backward()",
            "Keep the graph's buffers after D's backward (the SRGAN code does)",
            "bt-gan-retain",
            SRGAN_SETTINGS.retain_graph,
            self._show_code,
        )
        self.detach = self._checkbox(
            "D's fake term uses fake.detach()",
            "Cut the generator out of the discriminator's loss",
            "bt-gan-detach",
            SRGAN_SETTINGS.detach,
            self._show_code,
        )
        self.fresh_pass = self._checkbox(
            "g_loss from a fresh netD(fake) pass",
            "Unticked: g_loss reuses fake_out from D's pass, as the SRGAN code does",
            "bt-gan-fresh-pass",
            SRGAN_SETTINGS.fresh_pass,
            self._show_code,
        )
        self.order = widgets.ToggleButtons(
            options=[("before g_loss.backward()", "before"), ("after g_loss.backward()", "after")],
            value="before" if SRGAN_SETTINGS.d_step_first else "after",
            description="optimizerD.step()",
            tooltip="When the discriminator's optimizer updates its weights",
            tooltips=[
                "Update D between the two backward calls (the SRGAN order)",
                "Update D only after g_loss.backward() (the tempting fix)",
            ],
            style={"description_width": "initial", "button_width": "auto"},
        )
        self.order.add_class("bt-gan-order")
        self.order.observe(lambda _change: self._safely(self._show_code), names="value")
        self.run_button = self._button(
            "Run one step", "Run the step shown below once and check its gradients", "bt-gan-run", self.run
        )
        self.run_all_button = self._button(
            "Try all 16 combinations",
            "Run every combination of the four switches and fill the table",
            "bt-gan-run-all",
            self.run_all,
        )
        self.code = widgets.HTML(value="")
        self.code.add_class("bt-gan-code")
        self.outcome = widgets.HTML(value="")
        self.outcome.add_class("bt-gan-outcome")
        self.values, figures = self._figure_rows(_FIGURES, css="bt-gan-value", initial="-")
        self.summary = widgets.HTML(value="")
        self.summary.add_class("bt-gan-summary")
        self.status = self._status_line("bt-gan-status")
        self.panel = widgets.VBox(
            [
                widgets.HTML(f"<b>{html.escape(title)}</b>"),
                self.retain,
                self.detach,
                self.fresh_pass,
                self.order,
                # Room above, so the run buttons do not read as a third option of the order toggle.
                widgets.HBox([self.run_button, self.run_all_button], layout=widgets.Layout(margin="10px 0 0 0")),
                self.code,
                self.outcome,
                figures,
                self.status,
                self.summary,
            ]
        )
        self.panel.add_class("bt-gan-lab")

    # -- state -----------------------------------------------------------------------------
    @property
    def settings(self) -> StepSettings:
        """The step the switches describe now."""
        return StepSettings(
            bool(self.retain.value), bool(self.detach.value), bool(self.fresh_pass.value), self.order.value == "before"
        )

    @settings.setter
    def settings(self, settings: StepSettings) -> None:
        if not isinstance(settings, StepSettings):
            raise TypeError(f"GanLab.settings takes StepSettings, not {type(settings).__name__}.")
        self.retain.value, self.detach.value = settings.retain_graph, settings.detach
        self.fresh_pass.value = settings.fresh_pass
        self.order.value = "before" if settings.d_step_first else "after"

    # -- actions ---------------------------------------------------------------------------
    def _after_error(self) -> None:
        self.message = f"Error: {self.last_error}"

    def _set_status(self, message: str) -> None:
        self.message = message
        self._show_status(message)

    def _show_code(self) -> None:
        self.code.value = f"<pre style='font-size:85%;line-height:1.25'>{html.escape(self.settings.code)}</pre>"

    def _check(self, settings: StepSettings) -> StepCheck:
        step = make_step(settings, self.checker.d_loss_fn, self.checker.g_loss_fn)
        result = self.checker.check(step, name=settings.label)
        self.results[settings] = result
        return result

    def run(self) -> None:
        """Build the step from the switches, check it, and show the verdict and the figures."""
        result = self._check(self.settings)
        self.last_check = result
        self.last_error = None
        self._show_result(result)
        self._set_status(f"Ran: {self.settings.label}.")
        self._show_summary()

    def run_all(self) -> None:
        """Check every combination of the switches (the switches themselves are left as they are)."""
        for settings in StepSettings.all():
            self._check(settings)
        self.last_error = None
        self._show_summary()
        counts = {
            outcome: sum(r.outcome == outcome for r in self.results.values())
            for outcome in ("error", "silently wrong", "correct")
        }
        self._set_status(
            f"Tried all 16: {counts['error']} raise, {counts['silently wrong']} are silently wrong, "
            f"{counts['correct']} are correct."
        )

    def _show_result(self, result: StepCheck) -> None:
        # The verdict's red or green words on a light card of its own, so they stay readable in a dark theme.
        self.outcome.value = f"<div style='{_CARD}'>{result._repr_html_()}</div>"
        for key, network in (("d-grad", "D"), ("g-grad", "G")):
            check = result.networks.get(network)
            self.values[key].value = "not computed: the step raised" if check is None else check.describe()
        self.values["peak-bytes"].value = _bytes_or_dash(result.peak_graph_only_bytes, "not measured: the step raised")
        held = result.held_at_d_step
        self.values["held-bytes"].value = "optimizerD.step() not reached" if held is None else format_bytes(held)
        self.values["seconds"].value = f"{result.seconds * 1e3:.1f} ms"

    def summary_table(self) -> Table:
        """Every combination tried so far, in a fixed order."""
        rows = []
        for settings in StepSettings.all():
            result = self.results.get(settings)
            if result is None:
                continue
            outcome = result.outcome if result.outcome != "error" else f"error: {result.error_kind}"
            rows.append(
                [
                    "yes" if settings.retain_graph else "no",
                    "fake.detach()" if settings.detach else "fake",
                    "fresh netD(fake)" if settings.fresh_pass else "reuse fake_out",
                    "before" if settings.d_step_first else "after",
                    outcome,
                    _bytes_or_dash(result.peak_graph_only_bytes),
                ]
            )
        return Table(
            ["retain_graph", "D's fake input", "g_loss from", "optimizerD.step()", "outcome", "peak graph-only bytes"],
            rows,
        )

    def _show_summary(self) -> None:
        self.summary.value = self.summary_table()._repr_html_() if self.results else ""
