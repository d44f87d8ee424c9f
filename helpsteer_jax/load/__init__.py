"""Every model a task builds, from one weights source (`weights`): `model.load_model`."""
