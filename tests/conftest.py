import os

import torch

# Tests run on the CPU and never need a GPU; keep thread use predictable on small CI machines.
torch.set_num_threads(min(2, os.cpu_count() or 1))
