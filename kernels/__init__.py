"""infernetes.kernels"""
