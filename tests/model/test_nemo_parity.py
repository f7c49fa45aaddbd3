"""Parity with NeMo's own outputs on the tiny checkpoints in tests/fixtures/nemo-tiny (made with NeMo 3.0)."""
from __future__ import annotations

import pytest
import torch

from helpers import CONTEXTS, MODELS, fixture_model, greedy, reference
from streamd.model.encoder import EncoderCache
from streamd.model.transducer import Transducer

REL_TOL = 1e-4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("ctx", CONTEXTS)
def test_offline_encoder_and_greedy_match_nemo(kind: str, ctx: str) -> None:
    lm, ref = fixture_model(kind), reference(kind)
    m = lm.model
    dec = greedy(m)
    for name, inp in ref["inputs"].items():
        o = ref["offline"][ctx][name]
        mel_len = torch.tensor([inp["mel_len"]])
        with torch.no_grad():
            enc, enc_len = m.encoder(inp["mel"][None, :, : inp["mel_len"]], mel_len, CONTEXTS[ctx])
        assert int(enc_len) == o["encoded_len"]
        assert rel_err(enc[0], o["encoded"].T[: o["encoded_len"]]) <= REL_TOL, name
        # on NeMo's encoder output: the search alone
        (toks, times), = greedy(m)(o["encoded"].T[None], enc_len)[0].to_lists()
        assert toks == o["hyp"]["tokens"].tolist() and times == o["hyp"]["timestamp"].tolist(), name
        assert lm.tokenizer.decode(toks) == o["hyp"]["text"]
        # on our own encoder output: the whole model
        (toks2, times2), = dec(enc, enc_len)[0].to_lists()
        assert (toks2, times2) == (toks, times), name


@pytest.mark.parametrize("kind", MODELS)
def test_prediction_net_and_joint_match_nemo(kind: str) -> None:
    m, ref = fixture_model(kind).model, reference(kind)
    o = ref["offline"]["att70_13"]["in2_chirp_1p23s"]
    toks = o["hyp"]["tokens"][None]
    with torch.no_grad():
        g = m.decoder.teacher_forced(toks)[0]
        assert rel_err(g, o["prednet_out_teacher_forced"].T) <= REL_TOL
        enc = o["encoded"].T
        f = m.joint.project_encoder(enc)[:, None]
        logits = m.joint.joint_after_projection(f, m.joint.project_predictor(g)[None])
        assert rel_err(logits.log_softmax(-1), o["joint_logprobs_teacher_forced"]) <= REL_TOL


def test_ctc_head_matches_nemo() -> None:
    m, ref = fixture_model("hybrid").model, reference("hybrid")
    assert m.ctc_decoder is not None
    for name in ref["inputs"]:
        o = ref["offline"]["att70_13"][name]
        with torch.no_grad():
            lp = m.ctc_decoder(o["encoded"].T[None])[0]
        assert rel_err(lp, o["ctc_log_probs"]) <= REL_TOL
        assert torch.equal(lp.argmax(-1), o["ctc_hyp"]["frame_labels"])


def nemo_buffer_chunks(mel: torch.Tensor, first: int, rest: int, pre: int = 9) -> list[tuple[torch.Tensor, int]]:
    """NeMo's CacheAwareStreamingAudioBuffer over a (n_mels, T) mel: (input, drop) per step."""
    chunks, s = [(mel[:, :first], 0)], first
    while s < mel.shape[1]:
        new = mel[:, s: s + rest]
        cache = mel[:, max(0, s - pre): s]
        cache = torch.nn.functional.pad(cache, (pre - cache.shape[1], 0))
        chunks.append((torch.cat([cache, new], 1), 2))
        s += rest
    return chunks


@pytest.mark.parametrize("kv", [False, True], ids=["input_cache", "kv_cache"])
@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("ctx", CONTEXTS)
def test_streaming_chunks_match_nemo(kind: str, ctx: str, kv: bool, device: str = "cpu") -> None:
    """NeMo's own streaming convention (first chunk without cache and drop 0, zero-filled
    pre-encode cache, full mel tensor width), chunk by chunk, through `streaming_forward`, with
    either cache layout: NeMo's normalised inputs (compared with NeMo's cache) or keys and values
    (compared with the projections of NeMo's cache, over the frames it holds)."""
    lm, ref = fixture_model(kind), reference(kind)
    m = lm.model.to(device)
    dec = greedy(m)
    cfg = ref["meta"]["streaming_cfg"][ctx]
    r = CONTEXTS[ctx][1]
    for name, inp in ref["inputs"].items():
        st = ref["streaming"][ctx][name]
        chunks = nemo_buffer_chunks(inp["mel"], *cfg["chunk_size"])
        assert len(chunks) >= st["num_chunks"]
        cache: EncoderCache = m.encoder.init_cache(1, CONTEXTS[ctx], device, torch.float32, kv=kv)
        state = None
        for i, c in enumerate(st["chunks"]):
            x, drop = chunks[i]
            assert drop == c["drop_extra_pre_encoded"] and x.shape[1] == int(c["input_len"])
            if "input_mels" in c:
                assert torch.equal(x, c["input_mels"][0])
            with torch.no_grad():
                y, y_len, cache = m.encoder.streaming_forward(x[None].to(device), c["input_len"].to(device), cache,
                                                              CONTEXTS[ctx], drop_extra=drop)
            y, y_len = y.cpu(), y_len.cpu()
            if not c["keep_all_outputs"]:
                y_len = y_len.clamp(max=r + 1)
            assert y_len.tolist() == c["encoded_len"].tolist(), (name, i)
            n = int(y_len)
            if n:
                assert rel_err(y[0, :n], c["encoded"][0].T[:n]) <= REL_TOL, (name, i)
            assert cache.channel_len.tolist() == c["cache_last_channel_len_next"].tolist()
            if "cache_last_channel_next" in c:
                assert rel_err(cache.channel.cpu(), nemo_channel_cache(m, c["cache_last_channel_next"], kv,
                                                                       cache.channel_len)) <= REL_TOL
                assert rel_err(cache.time.cpu(), c["cache_last_time_next"]) <= REL_TOL
            hyps, state = dec(y[:, :n].to(device), y_len.to(device), state)
            h = c["hyps"][0]
            assert int(state.frames[0]) == sum(int(cc["encoded_len"][0]) for cc in st["chunks"][: i + 1])
            if "dec_state" in h:
                ds = h["dec_state"]
                assert int(state.label[0]) == int(ds["label"])
                assert rel_err(state.gproj[0].cpu(), ds["predictor_output"][0]) <= REL_TOL
                assert rel_err(state.h[:, 0].cpu(), ds["predictor_state"][0]) <= REL_TOL
    m.cpu()


def nemo_channel_cache(m: Transducer, channel: torch.Tensor, kv: bool, valid: torch.Tensor) -> torch.Tensor:
    """NeMo's `cache_last_channel` (L, B, C, d) in the layout `kv` says: as is, or each layer's
    keys then values of the frames it holds (the last `valid` of each row; the others zero, as
    the key/value cache keeps them)."""
    if not kv:
        return channel
    with torch.no_grad():
        att = [layer.self_attn.cpu() for layer in m.encoder.layers]
        out = torch.stack([torch.cat([a.linear_k(ch), a.linear_v(ch)], -1) for a, ch in zip(att, channel)])
        for a in att:
            a.to(m.device)
    c = channel.shape[2]
    held = torch.arange(c)[None] >= c - valid.cpu()[:, None]  # (B, C)
    return out * held[None, :, :, None]


@pytest.mark.cuda
@pytest.mark.parametrize("kv", [False, True], ids=["input_cache", "kv_cache"])
@pytest.mark.parametrize("kind", MODELS)
def test_streaming_chunks_match_nemo_on_cuda(kind: str, kv: bool) -> None:
    """The same on the GPU (fused attention), TF32 off."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        for ctx in CONTEXTS:
            test_streaming_chunks_match_nemo(kind, ctx, kv, "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
        fixture_model(kind).model.cpu()


@pytest.mark.parametrize("kv", [False, True], ids=["input_cache", "kv_cache"])
@pytest.mark.parametrize("kind", MODELS)
def test_streaming_tokens_match_nemo(kind: str, kv: bool) -> None:
    """Full NeMo-convention streaming decode: final tokens and global timestamps, either layout."""
    lm, ref = fixture_model(kind), reference(kind)
    m = lm.model
    for ctx, (left, r) in CONTEXTS.items():
        dec = greedy(m)
        cfg = ref["meta"]["streaming_cfg"][ctx]
        for name, inp in ref["inputs"].items():
            st = ref["streaming"][ctx][name]
            cache, state, toks, times = m.encoder.init_cache(1, (left, r), "cpu", torch.float32, kv=kv), None, [], []
            for (x, drop), c in zip(nemo_buffer_chunks(inp["mel"], *cfg["chunk_size"]), st["chunks"]):
                with torch.no_grad():
                    y, y_len, cache = m.encoder.streaming_forward(x[None], c["input_len"], cache, (left, r),
                                                                  drop_extra=drop)
                if not c["keep_all_outputs"]:
                    y_len = y_len.clamp(max=r + 1)
                (t, tm), = (h := dec(y[:, : int(y_len)], y_len, state))[0].to_lists()
                state = h[1]
                toks += t
                times += tm
            f = st["final_hyps"][0]
            assert toks == f["tokens"].tolist() and times == f["timestamp"].tolist(), (ctx, name)


@pytest.mark.parametrize("kind", MODELS)
def test_batched_offline_matches_nemo(kind: str) -> None:
    """All four inputs in one padded batch: the masked subsampling and attention."""
    m, ref = fixture_model(kind).model, reference(kind)
    b = ref["batched"]["offline_default_ctx"]
    with torch.no_grad():
        enc, enc_len = m.encoder(b["mel"], b["mel_len"], (70, 13))
    assert enc_len.tolist() == b["encoded_len"].tolist()
    for i in range(len(b["names"])):
        n = int(enc_len[i])
        assert rel_err(enc[i, :n], b["encoded"][i].T[:n]) <= REL_TOL
    for (toks, times), h in zip(greedy(m)(enc, enc_len)[0].to_lists(), b["hyps"]):
        assert toks == h["tokens"].tolist() and times == h["timestamp"].tolist()
