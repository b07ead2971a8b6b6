"""Published fine-tuning recipes, rebuilt as scripts (benchmarks/published_recipes.py runs them)."""
