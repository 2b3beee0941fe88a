"""Sampler: turns task seeds into `TrainingBatch`es (spec/sampling.md, seed 000 "Batch Structure").

`Sampler` builds batches of given seeds; `BatchStream` is the one stream of batches that training, validation,
evaluation, prediction and the benchmark read; `SamplerConfig` / `SplitConfig` are the `sampler` section of a run's
configuration.
"""

from confluence.batch import TrainingBatch
from confluence.sampler.builder import BuildResult
from confluence.sampler.config import SamplerConfig, SplitConfig
from confluence.sampler.data import SamplerData, TaskData
from confluence.sampler.sampler import Sampler, TaskEntry
from confluence.sampler.show import render_sequence
from confluence.sampler.stream import BatchStream

__all__ = ["BatchStream", "BuildResult", "Sampler", "SamplerConfig", "SamplerData", "SplitConfig",
           "TaskData", "TaskEntry", "TrainingBatch", "render_sequence"]
