"""Programs built on the product, not part of it: the one-minute demo and the sample worker."""
