"""Model code, checkpoint loading, the model runner and the sampler."""
