"""Every backbone: output shapes, one LARS training step, checkpoint save / load_model round trip."""

from __future__ import annotations

import pytest
import torch

from moquad.config import PretrainConfig, to_dict
from moquad.errors import MoquadError
from moquad.models import BACKBONES, build_backbone, build_model
from moquad.train import checkpoint
from moquad.train.lars import LARS, param_groups
from moquad.train.losses import moquad_loss


@pytest.mark.parametrize("name", BACKBONES)
def test_backbone_step_and_roundtrip(name, tmp_path):
    torch.manual_seed(0)
    model = build_model(name, proj_dim=16, proj_hidden=32)
    frames = 8 if name == "s3d" else 4  # S3D's temporal pooling needs 8 frames
    x = torch.randn(2, 4, 3, frames, 32, 32)  # 2 videos x 4 views, 32 px
    assert model.backbone(x[:, 0]).shape == (2, BACKBONES[name].dim)  # the row states the size; the network has it
    z = model(x.flatten(0, 1))
    assert z.shape == (8, 16)
    opt = LARS(param_groups(model, 1e-6), lr=0.1, weight_decay=1e-6)
    before = [p.detach().clone() for p in model.parameters()]
    loss, _ = moquad_loss(z.reshape(2, 4, 16), tau=0.1, hard_beta=0.0, hard_alpha=1.5)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))

    cfg = to_dict(PretrainConfig(backbone=name, proj_dim=16, proj_hidden=32))
    path = checkpoint.save(
        {"model": model.state_dict(), "step": 1, "epoch": 0, "config": cfg}, tmp_path / "c.pt"
    )
    loaded, ckpt = checkpoint.load_model(path)
    assert ckpt["step"] == 1
    model.eval()
    loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x[:, 0]), model(x[:, 0]))


def test_r3d50_is_cvrl_shape():
    from moquad.models.r3d50 import R3D50

    net = R3D50()
    assert net.stem[0].kernel_size == (5, 7, 7) and net.stem[0].stride == (2, 2, 2)
    assert [len(s) for s in (net.res2, net.res3, net.res4, net.res5)] == [3, 4, 6, 3]
    assert net.res3[0].conv1.kernel_size == (1, 1, 1) and net.res4[0].conv1.kernel_size == (3, 1, 1)
    assert 31e6 < sum(p.numel() for p in net.parameters()) < 33e6  # ~31.7 M like SlowOnly-R50


def test_unknown_backbone():
    with pytest.raises(ValueError, match="unknown backbone"):
        build_model("resnet9000", 16, 32)


def test_checkpoint_save_is_atomic(tmp_path):
    path = tmp_path / "ckpt" / "last.pt"
    checkpoint.save({"step": 1, "model": {}, "config": {}}, path)
    checkpoint.save({"step": 2, "model": {}, "config": {}}, path)
    assert checkpoint.load(path)["step"] == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]  # no temp files left
    with pytest.raises(FileNotFoundError):
        checkpoint.load(tmp_path / "missing.pt")
    with pytest.raises(MoquadError, match="not a moquad"):
        checkpoint.load_model(path)


def test_backbone_table_is_the_config_choices_and_imports_no_torch():
    import subprocess
    import sys

    from moquad.settings import choices as table_choices

    choices = table_choices(PretrainConfig, "backbone")
    assert choices == tuple(BACKBONES)
    code = ("import sys, moquad.config, moquad.models; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(sorted(moquad.models.BACKBONES))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(sorted(BACKBONES))
    assert build_backbone("tiny")[1] == BACKBONES["tiny"].dim == 64


def test_head_sizes_come_from_the_caller():
    with pytest.raises(TypeError):
        build_model("tiny")  # no hidden 2048 / 128: PretrainConfig.proj_dim / proj_hidden are the one default
    model = build_model("tiny", proj_dim=7, proj_hidden=9)
    assert [m.out_features for m in model.head.net if isinstance(m, torch.nn.Linear)] == [9, 7]


def test_frame_difference_input_is_the_rgb_network_on_differences(tmp_path):
    """model_input=diff: the same weights (same keys) applied to x[t+1] - x[t]; a checkpoint and the fine-tuning
    network rebuild it from the config."""
    torch.manual_seed(0)
    diff = build_model("tiny", 16, 32, "diff").eval()
    rgb = build_model("tiny", 16, 32).eval()
    rgb.load_state_dict(diff.state_dict())  # no extra parameters: the hook is the whole difference
    x = torch.randn(3, 3, 6, 32, 32)
    d = torch.stack([x[:, :, t + 1] - x[:, :, t] for t in range(5)], 2)  # per-frame reference
    with torch.no_grad():
        torch.testing.assert_close(diff.backbone(x), rgb.backbone(d))
        assert not torch.allclose(diff.backbone(x), rgb.backbone(x))
    cfg = to_dict(PretrainConfig(backbone="tiny", proj_dim=16, proj_hidden=32, model_input="diff"))
    path = checkpoint.save({"model": diff.state_dict(), "step": 1, "epoch": 0, "config": cfg}, tmp_path / "c.pt")
    loaded, _ = checkpoint.load_model(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval().backbone(x), rgb.backbone(d))
    with pytest.raises(ValueError, match="unknown model input 'flow'"):
        build_backbone("tiny", "flow")


def test_the_default_input_is_stated_once(tmp_path):
    """A call, a checkpoint or a card that names no input reads the config's default, a row of INPUTS."""
    from moquad.models.backbones import DEFAULT_INPUT, INPUTS

    assert DEFAULT_INPUT == PretrainConfig().model_input and DEFAULT_INPUT in INPUTS
    cfg = to_dict(PretrainConfig(backbone="tiny", proj_dim=16, proj_hidden=32))
    del cfg["model_input"]  # a config that names none
    torch.manual_seed(0)
    model = build_model("tiny", 16, 32)
    path = checkpoint.save({"model": model.state_dict(), "step": 1, "epoch": 0, "config": cfg}, tmp_path / "c.pt")
    loaded, _ = checkpoint.load_model(path)
    x = torch.randn(1, 3, 4, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval().backbone(x), model.eval().backbone(x))
