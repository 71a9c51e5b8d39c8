"""The sweeps that chose `training.recipe.RECIPE` (CPU and GPU scale); their results go to runs/."""
