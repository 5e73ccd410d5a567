"""The compatibility layer with the book "Dive into Deep Learning": its names and classes
(HyperParameters, Module, DataModule, Trainer, ProgressBoard, FashionMNIST, train_ch6, ...),
so that the book's code runs with `import d2l_gpu as d2l`.

Imports core and d2l_gpu.data only; importing this package imports nothing else.
"""
