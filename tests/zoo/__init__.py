"""The model zoo's generated part: models made by the shipping tool chains (see scripts/make_zoo_models.py)."""
