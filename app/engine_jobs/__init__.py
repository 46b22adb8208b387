"""Smaller models from bigger ones: the use-cases behind `swapcast engines dataset|prune|distill|distill-swap|
report` (`app.commands.engine_tools` parses their arguments and prints what they made)."""
