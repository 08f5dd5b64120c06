"""A model's ways in and out: saving and loading, pickling, scikit-learn estimators, preprocessing."""
