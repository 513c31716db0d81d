"""The compiler path (a torch.compile backend): diagnosis of what blocks capture in each FX graph so far."""
