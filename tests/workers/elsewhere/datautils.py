"""The data module beside the script, as the tutorials keep it (pytorch/examples' ddp-tutorial-series)."""

import torch
from torch.utils.data import Dataset


class MyTrainDataset(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.size = size
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]
