"""cuda-python implementation (VMM mechanisms, eager allocator, execution
provider) and a host driver emulator.  Importing this package never touches
the CUDA driver; the driver is loaded on first use."""
