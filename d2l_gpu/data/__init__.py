"""The data layer: Fashion-MNIST (fashion_mnist.py: find, download, read, batch), the IDX format
(idx.py), batching arguments (batches.py), downloads (download.py) and random workloads (toy.py).

Imports only the core modules of d2l_gpu; importing this package imports nothing else.
"""
