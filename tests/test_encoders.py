"""The encoder table: each family's features are its library's own forward, its tokens its own grid, its
normalisation its own processor's; a clip it cannot take and every bad name are one line that names the fix.

The Hugging Face families are tiny random models written with ``save_pretrained`` (nothing is downloaded); the
reference is the library's own model, fed by the library's own processor (``do_resize`` / ``do_center_crop`` off).
Tolerance: the two normalisations round differently (``x / 255 - mean`` vs moquad's ``x - 255 mean``), ~1e-7 per
pixel, and float32 layers carry it to ~1e-6; both sides run in this process.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from torch import nn
from video_fixtures import make_checkpoint

from moquad.errors import MoquadError, user_message
from moquad.eval import encoders as E
from moquad.eval.encoders import hf as H

T = pytest.importorskip("transformers")

FRAMES, SIZE = 8, 32
MEAN, STD = [0.3, 0.4, 0.5], [0.2, 0.25, 0.3]  # not any library's default: the test sees they are read
ATOL = 1e-5


def tiny(family: str, layers: int = 2) -> tuple[nn.Module, object | None]:
    """A tiny random model of ``family`` (8 frames of 32 px, width 32) and the processor saved beside it."""
    torch.manual_seed(0)
    c = dict(hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64)
    norm = dict(image_mean=MEAN, image_std=STD)
    if family == "vjepa2":
        cfg = T.VJEPA2Config(patch_size=8, crop_size=SIZE, frames_per_clip=FRAMES, tubelet_size=2, hidden_size=32,
                             num_hidden_layers=layers, num_attention_heads=4, mlp_ratio=2.0, num_pooler_layers=1,
                             pred_hidden_size=16, pred_num_attention_heads=2, pred_num_hidden_layers=1)
        return T.VJEPA2Model(cfg), T.VJEPA2VideoProcessor(**norm)
    if family == "videomae":
        cfg = T.VideoMAEConfig(image_size=SIZE, patch_size=8, num_frames=FRAMES, tubelet_size=2, **c)
        return T.VideoMAEModel(cfg), T.VideoMAEVideoProcessor(**norm)
    if family == "timesformer":
        return T.TimesformerModel(T.TimesformerConfig(image_size=SIZE, patch_size=8, num_frames=FRAMES, **c)), \
            T.TimesformerVideoProcessor(**norm)
    if family == "vivit":  # its processor maps x to x / 127.5 - 1 before mean / std
        return T.VivitModel(T.VivitConfig(image_size=SIZE, num_frames=FRAMES, tubelet_size=[2, 8, 8], **c)), \
            T.VivitVideoProcessor(**norm)
    vision = dict(c, image_size=SIZE, patch_size=8, num_frames=FRAMES)
    if family == "xclip_vision":  # the vision tower alone, no processor: the library's defaults
        return T.XCLIPVisionModel(T.XCLIPVisionConfig(**vision)), None
    mit = dict(mit_hidden_size=32, mit_intermediate_size=64, mit_num_hidden_layers=1, mit_num_attention_heads=4)
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=100,
                max_position_embeddings=16)
    cfg = T.XCLIPConfig(text_config=text, vision_config={**vision, **mit}, projection_dim=32, prompt_layers=1,
                        prompt_attention_heads=4)
    return T.XCLIPModel(cfg), T.CLIPImageProcessor(**norm)


HF = ("vjepa2", "videomae", "timesformer", "vivit", "xclip", "xclip_vision")


def save(tmp_path, family: str, layers: int = 2):
    model, proc = tiny(family, layers)
    folder = tmp_path / f"{family}-{layers}"
    model.save_pretrained(folder)
    if proc is not None:
        proc.save_pretrained(folder)
    return folder, model.eval(), proc


def clips(n: int = 2, frames: int = FRAMES, size: int = SIZE) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, frames, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))


def library_pixels(family: str, proc, clip: torch.Tensor) -> torch.Tensor:
    """The library's processor on uint8 clips (N, 3, T, H, W) -> (N, T, 3, H, W), no resize or crop."""
    proc = proc or T.CLIPImageProcessor()
    kw = {"return_tensors": "pt", "do_resize": False, "do_center_crop": False}
    frames = clip.transpose(1, 2)  # (N, T, 3, H, W)
    if family.startswith("xclip"):
        return proc(images=list(frames.flatten(0, 1)), **kw)["pixel_values"].reshape(frames.shape)
    out = proc(videos=list(frames), **kw)
    return next(v for v in out.values() if torch.is_tensor(v))


@torch.no_grad()
def library_feature(family: str, folder, model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """The pooled feature as the library's own video classifier reads it (its head made the identity), or the
    library's own video feature (X-CLIP), or the stated token mean (V-JEPA 2: its classifier is a trained pooler)."""
    if family == "vjepa2":
        return model(pixels, skip_predictor=True).last_hidden_state.mean(1)
    if family == "xclip":
        return model.get_video_features(pixels).pooler_output
    if family == "xclip_vision":
        return model(pixels.flatten(0, 1)).pooler_output.reshape(*pixels.shape[:2], -1).mean(1)
    cls = {"videomae": T.VideoMAEForVideoClassification, "timesformer": T.TimesformerForVideoClassification,
           "vivit": T.VivitForVideoClassification}[family]
    head = cls.from_pretrained(folder).eval()
    head.classifier = nn.Identity()
    if family == "videomae":
        head.fc_norm = nn.Identity()  # the classification head's LayerNorm: not part of the encoder
    return head(pixels).logits


@pytest.mark.parametrize("family", HF)
def test_hf_features_are_the_library_forward(tmp_path, family):
    folder, model, proc = save(tmp_path, family)
    enc = E.load_encoder(f"hf:{folder}")
    assert enc.family_name == family.split("_")[0] and enc.label == folder.name
    want_mean = proc.image_mean if proc is not None else T.CLIPImageProcessor().image_mean
    if family != "vivit":  # the processor's own numbers, read back from what it does to black and white frames
        assert enc.norm.mean == pytest.approx(want_mean, abs=1e-6)
    assert ("the library's CLIPImageProcessor defaults" in enc.norm.source) == (family == "xclip_vision")
    clip = clips()
    with torch.no_grad():
        got = enc(enc.normalize(clip, "cpu"))
    want = library_feature(family, folder, model, library_pixels(family, proc, clip))
    assert got.shape == (2, enc.out_dim) and want.abs().mean() > 0.1
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)


def test_vivit_processor_offset_is_read_not_assumed(tmp_path):
    """ViViT's video processor rescales to x / 127.5 - 1 before its mean / std: the table states the result."""
    folder, _, _ = save(tmp_path, "vivit")
    enc = E.load_encoder(f"hf:{folder}")
    # ((x / 127.5 - 1) - m) / s  ==  (x / 255 - (1 + m) / 2) / (s / 2)
    assert enc.norm.mean == pytest.approx([(1 + m) / 2 for m in MEAN], abs=1e-6)
    assert enc.norm.std == pytest.approx([s / 2 for s in STD], abs=1e-6)


def _zero_positions(family: str, net: nn.Module) -> None:
    """Position tables to 0, so a 0-layer model's tokens are its patch embedding (+ its final LayerNorm); V-JEPA 2
    has none (rotary positions act inside attention)."""
    if family == "videomae":  # a fixed sin-cos table, not a parameter
        net.embeddings.position_embeddings = torch.zeros_like(net.embeddings.position_embeddings)
    elif family == "xclip":
        net.vision_model.embeddings.position_embedding.weight.data.zero_()
    elif family != "vjepa2":
        for name in ("position_embeddings", "time_embeddings"):
            if hasattr(net.embeddings, name):
                getattr(net.embeddings, name).data.zero_()


def _patch_grid(family: str, net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The library's patch projection of normalised clips (N, 3, T, H, W) on its own conv grid (N, C, t, h, w), then
    the LayerNorm a 0-layer model applies after it."""
    def ln(m: nn.Module, g: torch.Tensor) -> torch.Tensor:
        return m(g.permute(0, 2, 3, 4, 1)).permute(0, 4, 1, 2, 3)

    if family in ("timesformer", "xclip"):  # a 2D conv per frame
        conv = net.embeddings.patch_embeddings.projection if family == "timesformer" else \
            net.vision_model.embeddings.patch_embedding
        n, _, t, h, w = x.shape
        g = conv(x.transpose(1, 2).flatten(0, 1)).unflatten(0, (n, t)).transpose(1, 2)
        return ln(net.layernorm if family == "timesformer" else net.vision_model.pre_layernorm, g)
    if family == "vjepa2":
        return ln(net.encoder.layernorm, net.encoder.embeddings.patch_embeddings.proj(x))
    conv = net.embeddings.patch_embeddings.projection
    g = conv(x)
    return ln(net.layernorm, g) if family == "vivit" else g  # VideoMAE (mean pooling): no final LayerNorm


@pytest.mark.parametrize("family", ("vjepa2", "videomae", "timesformer", "vivit", "xclip"))
def test_hf_token_grid_is_the_patch_grid(tmp_path, family):
    """With no layers, the tokens ARE the patch embedding: the grid's (t, h, w) order is the conv's own."""
    folder, _, _ = save(tmp_path, family, layers=0)
    enc = E.load_encoder(f"hf:{folder}")
    _zero_positions(family, enc.net)
    x = enc.normalize(clips(), "cpu")
    with torch.no_grad():
        got, want = enc.tokens(x), _patch_grid(family, enc.net, x)
    assert got.shape == want.shape == (2, 32, FRAMES // (1 if family in ("timesformer", "xclip") else 2), 4, 4)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("family", ("vjepa2", "videomae", "vivit"))
def test_mean_pooled_and_token_grids_agree(tmp_path, family):
    """Mean-pooled families: the feature is the mean of the token grid; CLS families (ViViT): it is not a patch
    token, and the grid holds exactly the patch tokens."""
    folder, _, _ = save(tmp_path, family)
    enc = E.load_encoder(f"hf:{folder}")
    x = enc.normalize(clips(), "cpu")
    with torch.no_grad():
        feat, tok = enc(x), enc.tokens(x)
    close = torch.allclose(tok.mean((2, 3, 4)), feat, atol=ATOL)
    assert close == (family != "vivit")


REFUSED = [  # family, frames, size -> what the line says
    ("vivit", 16, SIZE, "takes exactly 8 frames of exactly 32 x 32 px, not 16 frames of 32 px; pass --frames 8"),
    ("timesformer", FRAMES, 48, "takes exactly 8 frames of exactly 32 x 32 px, not 8 frames of 48 px; pass --size 32"),
    ("videomae", 4, 48, "pass --frames 8 --size 32"),
    ("xclip", 4, SIZE, "takes exactly 8 frames of exactly 32 x 32 px"),
    ("vjepa2", 7, SIZE, "takes any multiple of 2 frames of exactly 32 x 32 px, not 7 frames of 32 px; pass --frames 8"),
    ("vjepa2", 16, 48, "pass --size 32"),
]


@pytest.mark.parametrize(("family", "frames", "size", "says"), REFUSED, ids=[f"{r[0]}-{r[1]}x{r[2]}" for r in REFUSED])
def test_a_clip_the_model_cannot_take_is_one_line(tmp_path, family, frames, size, says):
    folder, _, _ = save(tmp_path, family)
    enc = E.load_encoder(f"hf:{folder}")
    with pytest.raises(MoquadError) as e:
        enc(enc.normalize(clips(1, frames, size), "cpu"))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_vjepa2_takes_other_frame_counts(tmp_path):
    """V-JEPA 2's rotary positions extend to any number of tubelets (its config: frames do not impact inference)."""
    folder, model, proc = save(tmp_path, "vjepa2")
    enc = E.load_encoder(f"hf:{folder}")
    clip = clips(1, 16)
    with torch.no_grad():
        got = enc(enc.normalize(clip, "cpu"))
    torch.testing.assert_close(got, library_feature("vjepa2", folder, model, library_pixels("vjepa2", proc, clip)),
                               atol=ATOL, rtol=ATOL)
    assert (enc.clip.frames, enc.clip.size, enc.clip.frame_step) == (FRAMES, SIZE, 4)


# ----------------------------------------------------------------------------- torchvision and moquad rows

TV = ("r3d_18", "mc3_18", "r2plus1d_18", *(pytest.param(a, marks=pytest.mark.slow) for a in ("s3d", "mvit_v2_s",
                                                                                            "swin3d_t")))


@pytest.mark.parametrize("arch", TV)
def test_torchvision_features_are_torchvisions_forward(arch):
    """Random init: torchvision's own model with moquad's weights, made headless as the export card says, fed
    clips normalised by torchvision's own normalize with its weights' mean / std."""
    import torchvision.models.video as tvv
    import torchvision.transforms.v2.functional as TF
    from torchvision.models import get_model_weights

    from moquad.models import BACKBONES

    torch.manual_seed(0)
    enc = E.load_encoder(f"torchvision:{arch}")
    weights = get_model_weights(arch).DEFAULT
    t = weights.transforms()
    assert (enc.norm.mean, enc.norm.std, enc.clip.size) == (tuple(t.mean), tuple(t.std), t.crop_size[0])
    names = BACKBONES[arch].torchvision
    ref = getattr(tvv, arch)()
    exec(names.strip_head, {"model": ref, "torch": torch})  # the model card's own instructions
    ref.load_state_dict({k[len(names.prefix):]: v for k, v in enc.net.state_dict().items()})
    frames = 16 if arch == "s3d" else FRAMES  # S3D: its weights' minimum temporal size is 14
    clip = clips(2, frames)
    if arch == "mvit_v2_s":  # torchvision's forward takes the token grid from pos_encoding (export card)
        ref.pos_encoding.temporal_size, ref.pos_encoding.spatial_size = frames // 2, (SIZE // 4, SIZE // 4)
    x = TF.normalize(clip.transpose(1, 2).float() / 255, list(t.mean), list(t.std)).transpose(1, 2)
    with torch.no_grad():
        torch.testing.assert_close(enc(enc.normalize(clip, "cpu")), ref.eval()(x), atol=ATOL, rtol=1e-4)
        tok = enc.tokens(enc.normalize(clip, "cpu"))
    assert tok.dim() == 5 and tok.shape[1] == BACKBONES[arch].dim


def test_torchvision_weights_file_and_bad_names(tmp_path):
    import torchvision.models.video as tvv

    torch.manual_seed(2)
    tv = tvv.r3d_18().eval()
    torch.save(tv.state_dict(), tmp_path / "r3d.pth")  # with its classifier, as torchvision ships weights
    a, b = E.load_encoder(f"torchvision:r3d_18:{tmp_path / 'r3d.pth'}"), E.load_encoder(f"r3d_18:{tmp_path / 'r3d.pth'}")
    assert (a.label, a.family_name, b.label, b.family_name) == ("r3d_18-r3d", "torchvision", "r3d_18-r3d",
                                                                "torchvision")
    torch.testing.assert_close(a.net.state_dict(), b.net.state_dict())
    tv.fc = nn.Identity()
    x = a.normalize(clips(), "cpu")
    with torch.no_grad():
        torch.testing.assert_close(a(x), tv(x))
    for spec, says in ((f"torchvision:mc3_18:{tmp_path / 'r3d.pth'}", "do not fit"),
                       ("torchvision:r3d_18:NOPE", "neither a file nor a name of torchvision's r3d_18 weights "
                                                   "(KINETICS400_V1, DEFAULT)"),
                       ("torchvision:resnet50", "not a torchvision video model moquad reads")):
        with pytest.raises(MoquadError, match=says.replace("(", r"\(").replace(")", r"\)")) as e:
            E.load_encoder(spec)
        assert "\n" not in str(e.value)


def test_moquad_checkpoint_and_export_are_moquads_backbone(tmp_path):
    """A checkpoint and its export: the same features as moquad's own loader + normalize (bit for bit), the
    pre-training clip as the native clip, and the feature map's mean as the pooled feature (a CNN's tokens)."""
    from moquad.data.augment import normalize
    from moquad.export import export
    from moquad.train.checkpoint import load_model

    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", loader={"frames": 8, "size": 32})
    weights, _ = export(ckpt, "safetensors", tmp_path / "tiny.safetensors")
    a, b = E.load_encoder(str(ckpt)), E.load_encoder(f"mine={weights}")
    assert (a.label, b.label, a.family_name, b.family_name) == ("run", "mine", "moquad", "moquad")
    assert (a.clip.frames, a.clip.size, a.clip.frame_step) == (8, 32, 2) and a.out_dim == 64
    clip = clips()
    direct = load_model(ckpt)[0].backbone.eval()
    with torch.no_grad():
        want = direct(normalize(clip, "cpu"))
        assert torch.equal(a(a.normalize(clip, "cpu")), want)
        assert torch.equal(b(b.normalize(clip, "cpu")), want)
        torch.testing.assert_close(a.tokens(a.normalize(clip, "cpu")).mean((2, 3, 4)), want)


# ----------------------------------------------------------------------------- names and bad input


def test_names_parse_to_their_row():
    assert E.parse_spec("hf:facebook/vjepa2-vitl-fpc64-256") == ("vjepa2-vitl-fpc64-256", "hf",
                                                                  "facebook/vjepa2-vitl-fpc64-256")
    assert E.parse_spec("base=torchvision:r3d_18:KINETICS400_V1") == ("base", "torchvision", "r3d_18:KINETICS400_V1")
    assert E.parse_spec("mvit_v2_s:w.pth") == ("mvit_v2_s-w", "torchvision", "mvit_v2_s:w.pth")
    assert E.parse_spec("runs/a/checkpoints/last.pt") == ("a", "", "runs/a/checkpoints/last.pt")
    assert E.parse_spec("c:/x.pt")[1] == ""  # a scheme no row has: a path


def _one_line(spec: str, says: str) -> None:
    with pytest.raises(MoquadError) as e:
        E.load_encoder(spec)
    line = user_message(e.value)
    assert says in line and line == str(e.value) and "\n" not in line


def test_bad_hf_names_are_one_line_each(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    _one_line(f"hf:{tmp_path / 'empty'}", "has no config.json; give a folder written by save_pretrained")
    (tmp_path / "file.bin").write_bytes(b"x")
    _one_line(f"hf:{tmp_path / 'file.bin'}", "is a file; give the folder save_pretrained wrote")
    _one_line(f"hf:{tmp_path / 'no' / 'such' / 'folder'}", "no such folder, and not a hub name")
    image = T.ViTModel(T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                   image_size=32, patch_size=8))
    image.save_pretrained(tmp_path / "vit")
    _one_line(f"hf:{tmp_path / 'vit'}", "is a 'vit' model, not one of the video encoders moquad reads (vjepa2, "
                                        "videomae, timesformer, vivit, xclip, xclip_vision_model)")
    folder, model, _ = save(tmp_path, "videomae")
    wide = T.VideoMAEConfig(image_size=SIZE, patch_size=8, num_frames=FRAMES, tubelet_size=2, hidden_size=48,
                            num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    wide.save_pretrained(folder)  # the config of another width over the same weights
    _one_line(f"hf:{folder}", "its weights do not load into VideoMAEModel")
    from safetensors.torch import load_file, save_file

    folder, model, _ = save(tmp_path, "vivit")
    sd = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in sd.items() if ".layer.1." not in k}, folder / "model.safetensors",
              metadata={"format": "pt"})  # a shallower network's weights
    _one_line(f"hf:{folder}", "its weights do not fit VivitModel as its config describes it")
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    _one_line(f"hf:{folder}", "hf: encoders need the transformers package (moquad's hf extra); in a clone "
                              "of moquad run pip install -e '.[hf]' (or make setup: every extra from the lock)")


def test_moquad_file_not_found_names_every_form(tmp_path):
    _one_line(str(tmp_path / "nope.pt"), "give RUN/checkpoints/last.pt, an exported .safetensors, "
                                         "torchvision:ARCH[:WEIGHTS] or hf:FOLDER_OR_HUB_NAME")


def test_unreachable_downloads_are_one_line(monkeypatch):
    """torchvision's named weights and a hub name, where the network is not reachable: what to do instead."""
    import torch.hub

    def offline(*_a, **_k):
        raise OSError("network is unreachable")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    _one_line("torchvision:r3d_18:KINETICS400_V1", "cannot download https://download.pytorch.org/models/r3d_18-b3b3357e"
              ".pth (OSError); download it where the network is reachable and pass torchvision:r3d_18:FILE.pth")
    monkeypatch.setattr(T.AutoConfig, "from_pretrained", offline)
    monkeypatch.setattr(H, "_hub_reachable", lambda: True)  # the host resolves, the download fails
    _one_line("hf:facebook/vjepa2-vitl-fpc64-256", "hf:facebook/vjepa2-vitl-fpc64-256: cannot read its config (network "
              "is unreachable); download it where the hub is reachable (hf download facebook/vjepa2-vitl-fpc64-256 "
              "--local-dir DIR) and pass hf:DIR")
    monkeypatch.setattr(H, "_hub_reachable", lambda: False)  # no name resolution: no half-minute of retries
    _one_line("hf:facebook/vjepa2-vitl-fpc64-256", "hf:facebook/vjepa2-vitl-fpc64-256: the Hugging Face hub is not "
              "reachable from this machine; download it where")
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert H._hub_reachable() is False


def test_a_mistyped_folder_is_not_a_hub_name(tmp_path):
    """``hf:runs/typo`` where ``runs`` is a folder: no such folder (not a download advice for a hub name)."""
    _one_line(f"hf:{tmp_path}/typo", f"hf:{tmp_path}/typo: no such folder in {tmp_path}")


def test_no_network_download_says_only_the_error(monkeypatch, tmp_path, capfd):
    """torchvision's named weights through a proxy that does not answer: the one error line, and nothing before it
    (torch's own "Downloading:" line is not printed for a download that fails)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # the discard port: nothing listens, the connection is refused
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    capfd.readouterr()
    _one_line("torchvision:r3d_18:KINETICS400_V1", "torchvision:r3d_18:KINETICS400_V1: cannot download "
              "https://download.pytorch.org/models/r3d_18-b3b3357e.pth (URLError); download it where the network is "
              "reachable and pass torchvision:r3d_18:FILE.pth")
    said = capfd.readouterr()
    assert said.out == "" and said.err == ""  # the error line is all a user sees (moquad.cli prints it)
    assert not list((tmp_path / "torch").rglob("*.pth"))


# ----------------------------------------------------------------------------- framing: as the authors frame it

# family -> (short side, centre crop) of its processor's defaults (the library's: V-JEPA 2 crop x 256 / 224 first)
AUTHORS = {"vjepa2": (292, 256), "videomae": (224, 224), "timesformer": (224, 224), "vivit": (256, 224),
           "xclip": (224, 224)}


def _scene(h: int = 360, w: int = 480, frames: int = 2) -> torch.Tensor:
    """uint8 frames (T, H, W, 3) of a smooth scene with detail at every scale (a change of field of view shows)."""
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    chans = [127.5 + 60 * torch.sin(x / (9 + 4 * c)) * torch.cos(y / (13 + 3 * c)) + 60 * torch.sin((x + 2 * y) / 61)
             for c in range(3)]
    img = torch.stack(chans, -1).round().clamp(0, 255).to(torch.uint8)
    return torch.stack([img.roll(3 * t, 1) for t in range(frames)])


def _moquad_view(enc: E.Encoder, frames: torch.Tensor, crop: int) -> torch.Tensor:
    """moquad's test view of ``frames`` at crop ``crop`` through the encoder's framing, in 0..255 (3, T, S, S)."""
    from moquad.eval.clips import spatial_crops

    return spatial_crops(frames, crop, 1, enc.framing)[0].double()


def _pixels(pixel_values: torch.Tensor, norm: E.Norm) -> torch.Tensor:
    """A processor's output (T, 3, S, S) back in 0..255 through the encoder's stated normalisation -> (3, T, S, S)."""
    mean, std = torch.tensor(norm.mean).view(1, 3, 1, 1), torch.tensor(norm.std).view(1, 3, 1, 1)
    return (pixel_values.double() * std + mean).mul(255).transpose(0, 1)


@pytest.mark.parametrize("family", list(AUTHORS))
def test_framing_is_the_processors_on_a_360_by_480_frame(tmp_path, family):
    """moquad's view of a 360 x 480 frame through the family's framing equals the pixels its own processor makes
    (resize and centre crop at their defaults); the crop-only framing (a 14 % wider field of view for V-JEPA 2,
    ViViT) does not. Each result records the framing."""
    folder, _, proc = save(tmp_path, family)
    enc = E.load_encoder(f"hf:{folder}")
    resize, crop = AUTHORS[family]
    assert (enc.framing.resize, enc.framing.crop) == (resize, crop) and enc.framing.short_side(crop) == resize
    assert enc.record()["framing"] == dataclasses.asdict(enc.framing) and enc.framing.antialias
    frames = _scene()
    if family == "xclip":
        out = proc(images=list(frames.permute(0, 3, 1, 2)), return_tensors="pt")["pixel_values"]
    else:
        out = next(v for v in proc(videos=[frames.permute(0, 3, 1, 2)], return_tensors="pt").values()
                   if torch.is_tensor(v))[0]
    theirs = _pixels(out, enc.norm)
    ours = _moquad_view(enc, frames, crop)
    assert ours.shape == theirs.shape == (3, 2, crop, crop)
    tol = 1.5 if family == "xclip" else 0.75  # X-CLIP's CLIP processor resizes with PIL's bicubic, the others bilinear
    assert (ours - theirs).abs().mean() < tol
    if resize != crop:  # the crop-only view sees another field of view
        wider = _crop_only(frames, crop)
        assert (wider - theirs).abs().mean() > 10 * tol


def _crop_only(frames: torch.Tensor, crop: int) -> torch.Tensor:
    from moquad.eval.clips import spatial_crops

    return spatial_crops(frames, crop, 1)[0].double()


@pytest.mark.parametrize("arch", TV)
def test_torchvision_framing_is_its_weights_transforms(arch):
    """Each torchvision row's Kinetics weights: r3d_18, mc3_18, r2plus1d_18 resize to 128 x 171 and S3D to
    256 x 256 whatever the aspect, MViT and Swin3D the short side to 256; then the centre crop, without
    antialiasing (their transforms()). moquad's view of a 360 x 480 frame through the row's framing equals the
    transforms' pixels, and the crop-only view does not."""
    from torchvision.models import get_model_weights

    t = get_model_weights(arch).DEFAULT.transforms()
    enc = E.load_encoder(f"torchvision:{arch}")
    crop = t.crop_size[0]
    assert (enc.framing.resize, enc.framing.crop) == (min(t.resize_size), crop) and not enc.framing.antialias
    assert enc.record()["framing"]["resize"] == min(t.resize_size)
    frames = _scene()
    theirs = _pixels(t(frames.permute(0, 3, 1, 2)).transpose(0, 1), enc.norm)  # (3, T, crop, crop)
    ours = _moquad_view(enc, frames, crop)
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().mean() < 0.75
    assert (_crop_only(frames, crop) - theirs).abs().mean() > 7.5


def test_a_moquad_network_keeps_its_own_framing(tmp_path):
    from test_features import make_checkpoint

    from moquad.eval.clips import spatial_crops

    enc = E.load_encoder(str(make_checkpoint(tmp_path / "c.pt")))
    assert enc.framing.resize == enc.framing.crop == enc.clip.size and enc.framing.short_side(48) == 48
    frames = _scene(121, 77)  # odd sides: the rounding of the long side and of the centre show
    for crops in (1, 3):  # its own test view, pixel for pixel: the view moquad evaluated its networks with
        assert torch.equal(spatial_crops(frames, 32, crops, enc.framing), spatial_crops(frames, 32, crops))


def test_no_family_name_is_tested_outside_its_row():
    """A comparison with a family's name (``enc.family_name == "moquad"``) appears nowhere in the package: what a
    family does is its row's (moquad/eval/encoders/local.py, hf.py)."""
    import ast
    from pathlib import Path

    package = Path(E.__file__).resolve().parents[2]
    rows = {package / "eval" / "encoders" / "local.py", package / "eval" / "encoders" / "hf.py"}
    found = []
    for path in sorted(package.rglob("*.py")):
        if path in rows or path.name == "export.py":  # export's "torchvision" is its format, not a family
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                names = [n.value for n in (node.left, *node.comparators)
                         if isinstance(n, ast.Constant) and isinstance(n.value, str)]
                found += [(path.relative_to(package).as_posix(), node.lineno, v) for v in names if v in E.FAMILIES]
    assert not found, found
