"""Running the model: loader, model runner, layers, models and the sampler."""
