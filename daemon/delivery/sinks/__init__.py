"""The sinks, one file each: :mod:`.webhook`, :mod:`.mlflow`, :mod:`.wandb`, :mod:`.tensorboard`."""
