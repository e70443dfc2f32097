"""Models the tasks use (PyTorch modules) and the functional view that calls them on flat parameters."""
