"""The scripted optimizers, one module per torch.optim class (``base``: what each holds and runs);
``spec.optim`` maps the specs' names to them."""
