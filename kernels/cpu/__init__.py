"""The CPU path's native kernels: C sources built at first use (`native`), and the ops that call
them (`attention`, `elementwise`, `group_quant`), each falling back to the torch reference when
it cannot run."""
