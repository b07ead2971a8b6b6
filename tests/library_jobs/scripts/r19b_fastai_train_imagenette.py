# ruff: noqa: F403, F405, E401, E701, E702, E231, E272, E203, E741, I001  (kept as the original writes it)
"""Re-creation of fastai's `nbs/examples/train_imagenette.py` (master: the `fastai` package
names, `fastcore.script`), in its structure and idioms: `@call_parse` with `Param`
annotations, `torch.backends.cudnn.benchmark = True`, `untar_data(URLs.IMAGENETTE_320)` (found
under `$FASTAI_HOME/data` when extracted there, nothing downloaded), a `DataBlock` with
`GrandparentSplitter`, `RandomResizedCrop` / `FlipItem` item transforms and a `Normalize` batch
transform, `setup_distrib`, fastai's own optimizers (`ranger`: RAdam + Lookahead by default)
through `partial`, an `xresnet` picked from `globals()` by name with `act_cls` / `sa` / `pool`,
`LabelSmoothingCrossEntropy`, `to_fp16()`, a `MixUp` callback and `fit_flat_cos`.
"""
from fastai.basics import *
from fastai.vision.all import *
from fastai.callback.all import *
from fastai.distributed import *
from fastprogress import fastprogress
from torchvision.models import *
from fastai.vision.models.xresnet import *
from fastai.callback.mixup import *
from fastcore.script import *

torch.backends.cudnn.benchmark = True
fastprogress.MAX_COLS = 80

def get_dls(size, woof, bs, sh=0., workers=None):
    if size<=224: path = URLs.IMAGEWOOF_320 if woof else URLs.IMAGENETTE_320
    else        : path = URLs.IMAGEWOOF     if woof else URLs.IMAGENETTE
    source = untar_data(path)
    if workers is None: workers = min(8, num_cpus())
    batch_tfms = [Normalize.from_stats(*imagenet_stats)]
    if sh: batch_tfms.append(RandomErasing(p=0.3, max_count=3, sh=sh))
    dblock = DataBlock(blocks=(ImageBlock, CategoryBlock),
                       splitter=GrandparentSplitter(valid_name='val'),
                       get_items=get_image_files, get_y=parent_label,
                       item_tfms=[RandomResizedCrop(size, min_scale=0.35), FlipItem(0.5)],
                       batch_tfms=batch_tfms)
    return dblock.dataloaders(source, path=source, bs=bs, num_workers=workers)

@call_parse
def main(
    gpu:int=None, # GPU to run on
    woof:int=0, # Use imagewoof (otherwise imagenette)
    lr:float=1e-2, # Learning rate
    size:int=128, # Size (px: 128,192,256)
    sqrmom:float=0.99, # sqr_mom
    mom:float=0.9, # Momentum
    eps:float=1e-6, # epsilon
    epochs:int=5, # Number of epochs
    bs:int=64, # Batch size
    mixup:float=0., # Mixup
    opt:str='ranger', # Optimizer (adam,rms,sgd,ranger)
    arch:str='xresnet50', # Architecture
    sh:float=0., # Random erase max proportion
    sa:int=0, # Self-attention
    sym:int=0, # Symmetry for self-attention
    beta:float=0., # SAdam softplus beta
    act_fn:str='Mish', # Activation function
    fp16:int=0, # Use mixed precision training
    pool:str='AvgPool', # Pooling method
    dump:int=0, # Print model; don't train
    runs:int=1, # Number of times to repeat training
    meta:str='', # Metadata (ignored)
):
    "Training of Imagenette."

    gpu = setup_distrib(gpu)
    if gpu is not None: torch.cuda.set_device(gpu)
    if   opt=='adam'  : opt_func = partial(Adam, mom=mom, sqr_mom=sqrmom, eps=eps)
    elif opt=='rms'   : opt_func = partial(RMSprop, sqr_mom=sqrmom)
    elif opt=='sgd'   : opt_func = partial(SGD, mom=mom)
    elif opt=='ranger': opt_func = partial(ranger, mom=mom, sqr_mom=sqrmom, eps=eps, beta=beta)

    dls = get_dls(size, woof, bs, sh=sh)
    if not gpu: print(f'epochs: {epochs}; lr: {lr}; size: {size}; sqrmom: {sqrmom}; mom: {mom}; eps: {eps}')

    m,act_fn,pool = [globals()[o] for o in (arch,act_fn,pool)]

    for run in range(runs):
        print(f'Run: {run}')
        learn = Learner(dls, m(n_out=10, act_cls=act_fn, sa=sa, sym=sym, pool=pool), opt_func=opt_func, \
                metrics=[accuracy,top_k_accuracy], loss_func=LabelSmoothingCrossEntropy())
        if dump: print(learn.model); exit()
        if fp16: learn = learn.to_fp16()
        cbs = MixUp(mixup) if mixup else []
        #n_gpu = torch.cuda.device_count()
        #if gpu is None and n_gpu: learn.to_parallel()
        if num_distrib()>1: learn.to_distributed(gpu) # Requires `-m fastai.launch`
        learn.fit_flat_cos(epochs, lr, wd=1e-2, cbs=cbs)
