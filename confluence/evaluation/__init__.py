"""Evaluation, prediction and baselines (spec/training.md "Evaluation", "Prediction")."""
