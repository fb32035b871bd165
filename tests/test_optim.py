"""train.optimizer muon: the pair (Muon for the matrices, AdamW for the rest) against torch's
two optimizers stepped by hand on a copy of the same weights, and its state through a checkpoint."""

import copy

import torch
from torch import nn

from eyrie.train.optim import lr_lambda, make_optimizer
from eyrie.train.settings import settings_with_defaults


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 8, bias=False)
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 5, bias=False)

    def forward(self, x):
        return self.lm_head(self.norm(self.fc(x)))


def loss_of(model, x):
    return model(x).logsumexp(-1).mean()


def settings(**kw):
    return settings_with_defaults({"lr": 0.01, "head_lr_scale": 0.5, "weight_decay": 0.01, **kw})


def test_muon_steps_the_matrices_and_adamw_the_rest_as_torch_does():
    torch.manual_seed(0)
    model, x = Tiny(), torch.randn(6, 12)
    ref = copy.deepcopy(model)
    s = settings(optimizer="muon")
    opt = make_optimizer(model, s)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(2, 10, 0.1))
    # the reference: torch's own two optimizers, the same groups, the same schedule by hand
    muon = torch.optim.Muon(
        [ref.fc.weight], lr=0.01, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"
    )
    adamw = torch.optim.AdamW(
        [
            {"params": list(ref.norm.parameters()), "lr": 0.01},
            {"params": [ref.lm_head.weight], "lr": 0.005},
        ],
        betas=(0.9, 0.95),
        weight_decay=0.01,
    )
    f = lr_lambda(2, 10, 0.1)

    def schedule(step):
        for o, bases in ((muon, [0.01]), (adamw, [0.01, 0.005])):
            for g, base in zip(o.param_groups, bases, strict=True):
                g["lr"] = base * f(step)

    schedule(0)
    for step in range(4):
        for m in (model, ref):
            loss_of(m, x).backward()
        opt.step(), sched.step(), opt.zero_grad()
        for o in (muon, adamw):
            o.step(), o.zero_grad()
        schedule(step + 1)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)
    assert not torch.equal(model.fc.weight, Tiny().fc.weight)


def test_adamw_alone_unless_muon_is_asked_for():
    model = Tiny()
    assert isinstance(make_optimizer(model, settings()), torch.optim.AdamW)
    opt = make_optimizer(model, settings(optimizer="muon"))
    kinds = [type(p).__name__ for p in opt.parts]
    assert kinds == ["Muon", "AdamW"]
    assert opt.parts[0].param_groups[0]["params"] == [model.fc.weight]


def test_muon_state_survives_a_checkpoint(tmp_path):
    from eyrie.train.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(1)
    model, x = Tiny(), torch.randn(6, 12)

    def pair(m):
        opt = make_optimizer(m, settings(optimizer="muon"))
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(2, 10, 0.1))

    opt, sched = pair(model)
    for _ in range(2):
        loss_of(model, x).backward()
        opt.step(), sched.step(), opt.zero_grad()
    saved = save_checkpoint(tmp_path, 2, model, opt, sched, "same", keep=1)
    twin = Tiny()
    opt2, sched2 = pair(twin)
    assert load_checkpoint(saved, twin, opt2, sched2, "cpu") == 2  # weights_only load
    for m, o, sc in ((model, opt, sched), (twin, opt2, sched2)):
        loss_of(m, x).backward()
        o.step(), sc.step(), o.zero_grad()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q)
