# cudnn.benchmark on in every process of the arm (the experiment: faster conv algorithms for the subsampling).
import torch
torch.backends.cudnn.benchmark = True
