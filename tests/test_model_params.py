"""Parameter counts against the seeds' tables, the D_ff rule, and initialization statistics."""

import math

import jax
import numpy as np
import pytest

from confluence.model.config import ffn_hidden_dim
from confluence.model.transformer import RelationalTransformer, count_params
from tests.fixtures.configs import seed_model as seed_config


@pytest.fixture(scope="module")
def seed_model():
    return RelationalTransformer(seed_config(d_model=256, n_layers=2, n_heads=8, d_t=256), key=jax.random.key(0))


def test_value_encoding_has_203264_parameters(seed_model):
    assert count_params(seed_model.encoder) == 203_264
    enc = seed_model.encoder
    assert count_params(enc.column_name_encoder) == 65_792
    assert count_params(enc.numerical_encoder) == 512
    assert count_params(enc.timestamp_encoder) == 4_096
    assert enc.boolean_encoder.size == 512


def test_decoder_heads_have_70418_parameters(seed_model):
    assert count_params(seed_model.heads) == 70_418
    assert count_params(seed_model.heads.timestamp_decoder) == 3_855


def test_sdpa_gate_is_65536_per_sublayer_and_no_core_biases(seed_model):
    blk = seed_model.blocks[0]
    for sub in (blk.attn_out, blk.attn_in, blk.attn_col):
        assert sub.w_gate.shape == (256, 256) and sub.w_gate.size == 65_536
        # W_Q, W_K, W_V, W_O, W_gate and the temperature: nothing else (no biases)
        assert count_params(sub) == 5 * 65_536 + 8
    assert count_params(blk.ffn) == 3 * 256 * 768


def test_ffn_rounding_rule():
    assert ffn_hidden_dim(256) == 768
    assert ffn_hidden_dim(64) == 256
    assert ffn_hidden_dim(512) == 1536
    assert ffn_hidden_dim(384) == 1024  # 1024 = ceil(1024 / 256) * 256


def test_initialization_statistics(seed_model):
    n_layers = 2
    blk = seed_model.blocks[0]
    d = 256
    xavier = math.sqrt(6 / (2 * d))
    for w in (blk.attn_out.w_q, blk.attn_in.w_k, blk.attn_col.w_v, blk.attn_out.w_gate):
        w = np.asarray(w)
        assert np.abs(w).max() <= xavier
        assert np.std(w) == pytest.approx(xavier / math.sqrt(3), rel=0.02)  # U(-a, a) has std a / sqrt(3)
    scaled = xavier / math.sqrt(4 * n_layers)
    wo = np.asarray(blk.attn_out.w_o)
    assert np.abs(wo).max() <= scaled and np.std(wo) == pytest.approx(scaled / math.sqrt(3), rel=0.02)
    a_down = math.sqrt(6 / (768 + 256)) / math.sqrt(4 * n_layers)
    assert np.std(np.asarray(blk.ffn.w_down.weight)) == pytest.approx(a_down / math.sqrt(3), rel=0.02)
    assert np.std(np.asarray(blk.ffn.w_up.weight)) == pytest.approx(math.sqrt(6 / 1024) / math.sqrt(3), rel=0.02)
    np.testing.assert_allclose(np.asarray(blk.attn_in.temperature), math.sqrt(32))
    for norm in (blk.norm_out, blk.norm_ffn, seed_model.h0_norm, seed_model.final_norm):
        assert not np.any(np.asarray(norm.gamma))
    enc = seed_model.encoder
    emb = np.concatenate([np.asarray(enc.null_emb), np.asarray(enc.mask_emb), np.asarray(enc.identifier_emb),
                          np.asarray(enc.boolean_encoder).ravel()])
    assert np.std(emb) == pytest.approx(0.02, rel=0.1) and abs(np.mean(emb)) < 0.003
    assert not np.any(np.asarray(enc.categorical_encoder.bias))
    assert np.abs(np.asarray(enc.text_encoder.weight)).max() <= math.sqrt(6 / 512)


def test_bad_config_is_rejected_with_a_clear_message():
    from confluence.errors import ConfigError

    with pytest.raises(ConfigError, match="'d_model': 30 is not divisible by n_heads"):
        seed_config(d_model=30, n_heads=4)
