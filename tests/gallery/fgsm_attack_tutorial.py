"""The PyTorch tutorials' FGSM adversarial examples: the test loop takes the loss's gradient of the input image.

Source: pytorch/tutorials, beginner_source/fgsm_tutorial.py (commit 8bcd0ac63dff35599649fc78711b6c155717823f),
"Adversarial Example Generation". As published: the LeNet `Net` (conv1, conv2, Dropout2d, fc1, fc2, dropout under
`self.training`, log_softmax), `model.eval()`, fgsm_attack (`image + epsilon*data_grad.sign()`, clamped to [0, 1]),
and test(): per example `data.requires_grad = True`, `output = model(data)`, the initial prediction (an example
the model already gets wrong is skipped with `continue`), `F.nll_loss`, `model.zero_grad()`, `loss.backward()`,
`data_grad = data.grad.data`, the perturbed image, its re-classification, the `correct` count and up to 5
adversarial examples kept as detached numpy arrays. There is no optimizer: nothing trains. The iteration is one
example of the test loop, for one epsilon (0.1 of the published list). Retyped at CPU size: images of 1x16x16
instead of 1x28x28 (so the flattened conv features are 20 instead of 320: `x.view(-1, 20)`, fc1 20 -> 50), the
pretrained lenet_mnist_model.pth not loaded (the seeded initialization instead), and MNIST's test set (downloaded
by torchvision) replaced by 4 made-up images from torch.rand in a list standing in for the batch_size=1 loader,
labelled with the untrained model's own predictions except the third, so that it takes the `continue`; the
accuracy printout and the plots left out.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATIONS = 4

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}

epsilons = [0, .05, .1, .15, .2, .25, .3]
use_cuda = False


# LeNet Model definition
class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(20, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 20)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


# FGSM attack code
def fgsm_attack(image, epsilon, data_grad):
    # Collect the element-wise sign of the data gradient
    sign_data_grad = data_grad.sign()
    # Create the perturbed image by adjusting each pixel of the input image
    perturbed_image = image + epsilon*sign_data_grad
    # Adding clipping to maintain [0,1] range
    perturbed_image = torch.clamp(perturbed_image, 0, 1)
    # Return the perturbed image
    return perturbed_image


def build() -> dict:
    torch.manual_seed(0)
    # Define what device we are using
    device = torch.device("cuda" if (use_cuda and torch.cuda.is_available()) else "cpu")
    # Initialize the network
    model = Net().to(device)
    # Set the model in evaluation mode. In this case this is for the Dropout layers
    model.eval()
    images = torch.rand(ITERATIONS, 1, 1, 16, 16)
    with torch.no_grad():
        labels = [model(image).max(1)[1] for image in images]
    labels[2] = (labels[2] + 1) % 10
    test_loader = list(zip(images, labels))
    return {"model": model, "device": device, "test_loader": test_loader, "epsilon": epsilons[2], "position": 0,
            "correct": 0, "adv_examples": []}


def test_one(state: dict) -> None:
    """The body of test()'s `for data, target in test_loader:` for the next example."""
    model, device, epsilon, adv_examples = state["model"], state["device"], state["epsilon"], state["adv_examples"]
    data, target = state["test_loader"][state["position"] % len(state["test_loader"])]
    state["position"] += 1

    # Send the data and label to the device
    data, target = data.to(device), target.to(device)

    # Set requires_grad attribute of tensor. Important for Attack
    data.requires_grad = True

    # Forward pass the data through the model
    output = model(data)
    init_pred = output.max(1, keepdim=True)[1] # get the index of the max log-probability

    # If the initial prediction is wrong, dont bother attacking, just move on
    if init_pred.item() != target.item():
        return

    # Calculate the loss
    loss = F.nll_loss(output, target)

    # Zero all existing gradients
    model.zero_grad()

    # Calculate gradients of model in backward pass
    loss.backward()  # @backward

    # Collect datagrad
    data_grad = data.grad.data

    # Call FGSM Attack
    perturbed_data = fgsm_attack(data, epsilon, data_grad)

    # Re-classify the perturbed image
    output = model(perturbed_data)

    # Check for success
    final_pred = output.max(1, keepdim=True)[1] # get the index of the max log-probability
    if final_pred.item() == target.item():
        state["correct"] += 1
        # Special case for saving 0 epsilon examples
        if (epsilon == 0) and (len(adv_examples) < 5):
            adv_ex = perturbed_data.squeeze().detach().cpu().numpy()
            adv_examples.append( (init_pred.item(), final_pred.item(), adv_ex) )
    else:
        # Save some adv examples for visualization later
        if len(adv_examples) < 5:
            adv_ex = perturbed_data.squeeze().detach().cpu().numpy()
            adv_examples.append( (init_pred.item(), final_pred.item(), adv_ex) )


def run(state: dict, iterations: int = ITERATIONS) -> None:
    # Loop over all examples in test set
    for _ in range(iterations):
        test_one(state)
    # Calculate final accuracy for this epsilon
    final_acc = state["correct"]/float(len(state["test_loader"]))
    state["final_acc"] = final_acc


def step_function(state: dict) -> Callable[[], None]:
    return lambda: test_one(state)


if __name__ == "__main__":
    run(build())
