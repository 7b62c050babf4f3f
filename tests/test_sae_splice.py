"""An SAE spliced into the tiny model: its hook points are capture sites, the error term is exact, and the
model is as before afterwards (also after an exception)."""

import pytest
import torch

from workbench.errors import WorkbenchError

SITE = "blocks.1.hook_resid_post"
ACTS = f"{SITE}.hook_sae_acts_post"


def _sae(architecture: str):
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    torch.manual_seed(0)
    meta = SAEMetadata(hook_name=SITE, model_name="tiny")
    s = (TopKSAE(TopKSAEConfig(d_in=64, d_sae=96, k=8, metadata=meta)) if architecture == "topk"
         else StandardSAE(StandardSAEConfig(d_in=64, d_sae=96, metadata=meta)))
    with torch.no_grad():
        s.W_dec.copy_(torch.randn(96, 64) * 0.3)
        s.W_enc.copy_(s.W_dec.T.clone())
        s.b_dec.copy_(torch.randn(64) * 0.1)
    return s


@pytest.fixture(scope="module", params=["topk", "standard"])
def sae(request):
    return _sae(request.param)


@pytest.fixture(scope="module")
def tokens(tiny):
    from workbench.capture import tokenize

    ids, _, _ = tokenize(tiny, ["the river bank", "money and loans, cash"], None)
    width = max(len(x) for x in ids)
    return torch.tensor([x + [x[-1]] * (width - len(x)) for x in ids])


def _state(model):
    site = model.hook_dict[SITE]
    return (list(model.hook_dict.items()), list(model.mod_dict.items()), list(site.fwd_hooks),
            dict(site._forward_hooks), dict(site._modules))


def test_capture_stores_feature_activations_like_any_site(tiny, sae, tmp_path):
    from workbench.capture import capture
    from workbench.sae.splice import spliced

    prompts = ["the river bank", "money and loans, cash", "a boat on the stream"]
    with spliced(tiny, sae):
        store = capture(tiny, prompts, [SITE, ACTS], tmp_path / "both", positions="all", progress=False)
        alone = capture(tiny, prompts, [ACTS], tmp_path / "alone", positions="last", progress=False)
    x = store.get(SITE)
    with torch.no_grad():
        want = sae.encode(x)
    assert store.get(ACTS).shape == (len(x), 96)
    torch.testing.assert_close(store.get(ACTS), want, rtol=1e-5, atol=1e-5)
    assert (store.get(ACTS) > 0).any()
    last = torch.cumsum(torch.bincount(store.token_table()["row_index"]), 0) - 1  # each prompt's last token
    torch.testing.assert_close(alone.get(ACTS), want[last], rtol=1e-5, atol=1e-5)


def test_a_store_records_the_splice_and_never_resumes_under_another(tiny, sae, tmp_path):
    from workbench.capture import capture
    from workbench.sae.splice import sae_sha256, spliced

    prompts, deeper = ["the river bank", "money and loans"], "blocks.2.hook_resid_post"
    other = _sae("standard")
    with torch.no_grad():
        other.b_enc.add_(0.5)
    with spliced(tiny, sae):
        store = capture(tiny, prompts, [ACTS], tmp_path / "acts", progress=False)
        assert store.manifest["splices"] == [{"site": SITE, "error_term": True, "sae_sha256": sae_sha256(sae)}]
        assert capture(tiny, prompts, [ACTS], tmp_path / "acts", progress=False).complete  # same SAE: resumes
    with spliced(tiny, other), pytest.raises(WorkbenchError, match=r"holds another capture \(splices"):
        capture(tiny, prompts, [ACTS], tmp_path / "acts", progress=False)
    with spliced(tiny, sae, error_term=False):  # downstream sites differ too: a plain capture is another one
        capture(tiny, prompts, [deeper], tmp_path / "deeper", progress=False)
    with pytest.raises(WorkbenchError, match=r"holds another capture \(splices"):
        capture(tiny, prompts, [deeper], tmp_path / "deeper", progress=False)


def test_check_sites_knows_the_sae_points_only_while_spliced(tiny, sae):
    from workbench.capture import check_sites
    from workbench.sae.splice import spliced

    with spliced(tiny, sae) as names:
        assert check_sites(tiny, [ACTS, SITE]) == [ACTS, SITE]
        assert set(names.values()) <= set(tiny.hook_dict)
        with pytest.raises(WorkbenchError, match="did you mean .*hook_sae_acts_post") as err:
            check_sites(tiny, [f"{SITE}.hook_sae_act_post"])
        assert "\n" not in str(err.value)
    with pytest.raises(WorkbenchError, match="unknown site"):
        check_sites(tiny, [ACTS])


def test_error_term_leaves_the_logits_identical(tiny, sae, tokens):
    from workbench.sae.splice import spliced

    with torch.no_grad():
        clean = tiny(tokens)
        with spliced(tiny, sae):
            assert torch.equal(tiny(tokens), clean)
            read = []  # a hook on a feature point forces the clean pass for the error: still identical
            got = tiny.run_with_hooks(tokens, fwd_hooks=[(ACTS, lambda a, hook: read.append(a))])
            assert read and torch.equal(got, clean)


def test_a_feature_patched_with_error_term_moves_the_site_by_its_decoder_row(tiny, sae, tokens):
    """The error is the clean one: adding c to feature j at hook_sae_acts_post adds c * W_dec[j] to the site."""
    from workbench.sae.splice import spliced

    j, c = 5, 2.0

    def bump(a, hook):
        a = a.clone()
        a[..., j] += c
        return a

    def shift(a, hook):
        return a + c * sae.W_dec[j].to(a.dtype)

    with torch.no_grad():
        want = tiny.run_with_hooks(tokens, fwd_hooks=[(SITE, shift)])
        with spliced(tiny, sae):
            got = tiny.run_with_hooks(tokens, fwd_hooks=[(ACTS, bump)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_without_error_term_the_reconstruction_replaces_the_site(tiny, sae, tokens):
    from workbench.sae.splice import spliced

    with torch.no_grad():
        patched = tiny.run_with_hooks(tokens, fwd_hooks=[(SITE, lambda a, hook: sae.decode(sae.encode(a)))])
        with spliced(tiny, sae, error_term=False):
            got = tiny(tokens)
        assert not torch.equal(got, tiny(tokens))
    assert torch.equal(got, patched)


def test_the_model_is_restored_after_the_block_and_after_an_exception(tiny, sae, tokens):
    from workbench.sae.splice import spliced

    before, names, info = _state(tiny), {p: p.name for p in sae.hook_dict.values()}, tiny.workbench
    with torch.no_grad():
        clean = tiny(tokens)
        with spliced(tiny, sae, error_term=False):
            assert _state(tiny) != before
        assert _state(tiny) == before
        with pytest.raises(RuntimeError, match="inside"), spliced(tiny, sae, error_term=False):
            raise RuntimeError("inside")
        assert _state(tiny) == before
        assert torch.equal(tiny(tokens), clean)
    assert {p: p.name for p in sae.hook_dict.values()} == names
    assert tiny.workbench is info and "splices" not in info


def test_splices_nest_and_refuse_a_second_sae_at_one_site(tiny, sae, tokens):
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig

    from workbench.sae.splice import spliced

    before = _state(tiny)
    deeper = StandardSAE(StandardSAEConfig(d_in=64, d_sae=32, metadata=SAEMetadata(hook_name="blocks.2.hook_resid_post")))
    with torch.no_grad():
        clean = tiny(tokens)
        with spliced(tiny, sae), spliced(tiny, deeper):
            assert {ACTS, "blocks.2.hook_resid_post.hook_sae_acts_post"} <= set(tiny.hook_dict)
            assert torch.equal(tiny(tokens), clean)
            with pytest.raises(WorkbenchError, match="already spliced at blocks.1"), spliced(tiny, _sae("topk")):
                pass
            assert ACTS in tiny.hook_dict
    assert _state(tiny) == before


def test_an_sae_for_another_site_or_width_is_refused(tiny):
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig

    from workbench.sae.splice import spliced

    before = _state(tiny)
    for hook_name, d_in, match in (("blocks.9.hook_resid_post", 64, "unknown site"),
                                   (SITE, 32, "does not match")):
        bad = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=16, metadata=SAEMetadata(hook_name=hook_name)))
        with pytest.raises(WorkbenchError, match=match), spliced(tiny, bad):
            pass
    assert _state(tiny) == before


def test_the_token_gradient_read_through_the_splice_is_the_encoder_preactivation_gradient(tiny, sae):
    """``token_gradient_direction`` reads f_j at hook_sae_acts_pre: the same as differentiating the explicit
    pre-activation (x - b_dec) @ W_enc[:, j] + b_enc[j] at the site."""
    from workbench.sae.interventions import token_gradient_direction

    contexts = [[1, *range(10, 20)], [1, 50, 60, 70]]

    def reference(j):
        total, held = torch.zeros(64), {}

        def leaf(a, hook):
            held["embed"] = a.detach().requires_grad_(True)
            return held["embed"]

        def read(a, hook):
            held["f"] = (a[0, -1] - sae.b_dec) @ sae.W_enc[:, j] + sae.b_enc[j]

        for ids in contexts:
            with torch.enable_grad():
                tiny.run_with_hooks(torch.tensor([ids]), fwd_hooks=[("hook_embed", leaf), (SITE, read)])
                total += torch.autograd.grad(held["f"], held["embed"])[0][0, -1]
        return total / total.norm()

    for j in (0, 5, 40):
        torch.testing.assert_close(token_gradient_direction(tiny, sae, j, contexts), reference(j),
                                   rtol=1e-5, atol=1e-6)


def test_a_model_without_provenance_is_left_without_it(sae):
    from workbench.models.tiny import tiny_model
    from workbench.sae.splice import spliced

    bare = tiny_model()
    with spliced(bare, sae):
        assert bare.workbench["splices"][0]["site"] == SITE
    assert not hasattr(bare, "workbench")
