"""Tiny models without a hub: tokenizer from task text, Qwen2/Llama configs, save/load round trip."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.models.local import PROTOCOL_TAGS, load_pretrained, save_pretrained  # noqa: E402


def test_tokenizer_is_lossless_and_tags_are_single_tokens():
    tok = memqa_tokenizer()
    text = "<memory>Wigei: Wigei is a city in Wubuxora.\nÜber ☃</memory><search>Wubuxora</search>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == text
    for tag in PROTOCOL_TAGS:
        tag_ids = tok.encode(tag, add_special_tokens=False)
        assert len(tag_ids) == 1 and tok.decode(tag_ids, skip_special_tokens=True) == tag
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1
    assert tok.decode([tok.eos_token_id], skip_special_tokens=True) == ""


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_save_load_round_trip(tmp_path, arch):
    tok = memqa_tokenizer()
    model = tiny_model(tok, arch=arch)
    path = save_pretrained(model, tok, tmp_path / "m")
    save_pretrained(model, tok, path)  # replacing an existing checkpoint works
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    loaded, tok2 = load_pretrained(path)
    assert loaded.config.model_type == arch
    ids = torch.tensor([tok.encode("<task>Question 1: What is the capital of Wigei?</task>")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    text = "<memory>a b</memory><answer>c; d</answer>"
    assert tok2.encode(text) == tok.encode(text)
    assert tok2.decode(tok2.encode(text)) == text


def _subsequence(needle, hay):
    return any(hay[i:i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))


@pytest.mark.parametrize("style", ["isolated", "suffix", "prefix"])
def test_space_styles_are_lossless_and_copy_consistency_differs_as_documented(style):
    from agents.llm.models.local import build_tokenizer

    doc = ("Doc 1 (Title: Wubuxora) Wubuxora is governed from its capital Upper Daiteidair. Visitors often "
           "associate Wubuxora with tin mining.\nQuestion 1: What is the capital of Wubuxora?  Odd\tspacing\n\n")
    action = "<memory>Wubuxora: the capital is Upper Daiteidair.</memory><answer>Upper Daiteidair</answer>"
    tok = build_tokenizer([doc, action] * 50, vocab_size=400, split_spaces=style)
    for text in (doc, action, "  leading spaces, \u00fcml\u00e4uts and \u2603 \n"):
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    doc_ids = tok.encode(doc, add_special_tokens=False)
    answer = tok.encode("Upper Daiteidair", add_special_tokens=False)   # as written after <answer>
    title = tok.encode("Wubuxora", add_special_tokens=False)            # as written after <search>
    # isolated and suffix: the ids of a name after a tag occur in the document (before "." or ")"), so copying
    # it is an induction copy; GPT-2 style ("prefix") spells it differently after a space.
    assert _subsequence(answer, doc_ids) == (style != "prefix")
    assert _subsequence(title, doc_ids) == (style != "prefix")
    if style == "suffix":
        assert len(doc_ids) < 0.75 * len(build_tokenizer([doc, action] * 50, vocab_size=400).encode(doc))


def test_unknown_space_style_is_named():
    from agents.llm.models.local import build_tokenizer

    with pytest.raises(ValueError, match="split_spaces"):
        build_tokenizer(["abc"], split_spaces="tabs")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("style", ["isolated", "suffix", "prefix"])
def test_checkpoint_keeps_the_exact_tokenization(tmp_path, arch, style):
    """Regression: AutoTokenizer loaded tiny Qwen2 checkpoints as Qwen2Tokenizer, whose own regex replaced the
    saved pre-tokenizer (numbers split into digits, spaces glued to words), so a policy trained on one
    tokenization was evaluated and RL-trained on another after a reload."""
    from agents.llm.models.local import build_tiny_model, build_tokenizer, load_tokenizer

    corpus = ["Doc 1 (Title: Wigei) The population of Wigei is 570236. Wigei is a city in Wubuxora.\n",
              "<memory>Wigei: Wigei is a city in Wubuxora.</memory><answer>570236</answer>"] * 40
    tok = build_tokenizer(corpus, vocab_size=350, split_spaces=style)
    path = save_pretrained(build_tiny_model(tok, arch, hidden_size=16, layers=1, heads=2), tok, tmp_path / "m")
    probe = corpus[0] + corpus[1] + "  two  spaces, 12 345 and\ttabs\n\n"
    _, loaded = load_pretrained(path)
    assert loaded.encode(probe, add_special_tokens=False) == tok.encode(probe, add_special_tokens=False)
    assert load_tokenizer(path).encode(probe) == tok.encode(probe)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_float32_attention_under_bf16_autocast(tmp_path, monkeypatch, arch):
    from agents.llm.models.local import use_float32_attention

    tok = memqa_tokenizer()
    model = tiny_model(tok, arch=arch)
    ids = torch.tensor([tok.encode("<task>Question 1: What is the capital of Wigei?</task>")] * 2)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # right padding: a padding mask reaches the attention
    with torch.no_grad():
        plain = model(ids, attention_mask=mask).logits
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append(({q.dtype, k.dtype, v.dtype}, torch.is_autocast_enabled("cpu")))
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, attention_mask=mask)
    assert any(torch.bfloat16 in dtypes for dtypes, _ in seen)  # plain SDPA: a bf16 value under autocast

    use_float32_attention(model)
    seen.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids, attention_mask=mask).logits
    assert seen and all(dtypes == {torch.float32} and not autocast for dtypes, autocast in seen)
    assert (logits.float() - plain).abs().max() < 0.1  # still the same model, at bf16 precision elsewhere
    with torch.no_grad():  # without autocast it is exactly transformers' SDPA
        assert torch.equal(model(ids, attention_mask=mask).logits, plain)
    loaded, _ = load_pretrained(save_pretrained(model, tok, tmp_path / "m"))
    assert loaded.config._attn_implementation == "sdpa"  # not saved with the checkpoint
