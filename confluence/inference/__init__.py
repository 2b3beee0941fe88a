"""Inference: a trained or shipped model loaded once (`load_model` -> `LoadedModel`) and asked for its head outputs on
any seeds of any task (`Predictor`), with several context draws combined (`draws`). Evaluation, prediction and the
HTTP service all answer through it, so a number means the same thing whichever of them printed it."""

from confluence.inference.draws import DEFAULT_DRAWS, combine_draws
from confluence.inference.predictor import HeadOutputs, LoadedModel, Predictor, load_model

__all__ = ["DEFAULT_DRAWS", "HeadOutputs", "LoadedModel", "Predictor", "combine_draws", "load_model"]
