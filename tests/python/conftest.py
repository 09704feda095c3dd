"""pytest configuration for the orthopt Python tests."""
import os

import torch

# Use every core the machine has (CI has 2); torch's own default may pick fewer or more.
torch.set_num_threads(os.cpu_count() or 1)
