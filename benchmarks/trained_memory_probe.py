"""The trained-memory probe (docs/trained_memory.md): which memory WRITE can a pretrained SmolLM2-135M learn to read?
CPU, one thread, the variants side by side on one task; its logs of 2026-12-02 are in results/trained_memory_probe/.

    python benchmarks/trained_memory_probe.py --name armt_all --variant armt --write all --lr 3e-4 --minutes 33

Task (the same for every variant): the package's passkey generator (hmt_adapters.evaluation.tasks.passkey, 'repeat'
haystack, 5-digit key, answer ' ' + 5 digits = 6 tokens), prompt of nseg*seg - 6 tokens so that question and answer
share the LAST segment (layout fix), needle entirely inside segment 1 at a random depth (0 .. end of segment 1).
Loss: mean NLL of the 6 answer tokens (plateau with no information = 5 ln10 / 6 = 1.919).

Variants (--variant):
  sanity : 1 segment (needle + question + answer in one window), bare SmolLM2, no training: exact should be ~100%.
  armt   : ARMT-style associative memory (Rodkin et al. 2024) per decoder layer; --write all (every token of the
           segment writes) or --write mem (m learned memory tokens appended to the segment write, as in ARMT).
           read before layer l: h += W_o( A^T phi(q) / (z.phi(q)) ), q = W_q n(h); W_o zero-init -> wrapped == bare.
           write after layer l from its output h: k = phi(W_k n(h)), v = W_v n(h), beta = sigmoid(w_b n(h)),
           v_old = A^T k / (z.k), A += sum_t beta_t (v_t - v_old_t) k_t^T, z += sum_t k_t.  phi = DPFP(nu=3) or elu+1.
           n(h) = h / rms(h) (parameter-free; SmolLM2's residual has massive activations).
  tok    : token-space memory: k slots, each a straight-through Gumbel-softmax pointer over segment 1's INPUT token
           embeddings (forward: exactly one real token embedding per slot, so the frozen model reads it as text from
           step 0; backward: the soft pointer's gradient over all candidates). Scores = q_j . W_s n(h_t) with h_t the
           hidden state of a chosen layer; slots are placed in the order of the positions they point to.
           Read: the k slots are prepended to the next segment.
  rmt    : control, the package's RMT (wrap_with_memory 'rmt', 8 memory tokens, shipped write), LoRA r8 q/v (as
           exp3 variant B of the previous probe), with this file's data/eval. --rmt-write proj: the written slots go
           through a learned projection to the token embeddings' scale, W n(h) * rms(E) (W a d x d matrix started at
           the identity, E the token embeddings): what the next segment reads starts on the scale of text it reads.
--train memory (backbone frozen) | lora (add_lora r8 q/v + memory).

Every step: one JSON line to <out>/<name>.jsonl; held-out eval (n=32, fixed seeds) every --eval-every steps and at the
end, with memory and with memory disabled; a checkpoint every --eval-every steps (resumes from it).
"""

import argparse
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import torch
import torch.nn.functional as F
from torch import nn

torch.set_num_threads(1)
import hmt_adapters as ha  # noqa: E402
from hmt_adapters.backbones import smollm2  # noqa: E402
from hmt_adapters.evaluation.tasks import passkey  # noqa: E402

IGNORE = -100
ANSWER_LEN = 6
PLATEAU = 5 * math.log(10) / 6

p = argparse.ArgumentParser()
p.add_argument("--name", required=True)
p.add_argument("--variant", required=True, choices=["sanity", "armt", "tok", "rmt"])
p.add_argument("--write", default="all", choices=["all", "mem"])
p.add_argument("--train", default="memory", choices=["memory", "lora"])
p.add_argument(
    "--rmt-write", default="shipped", choices=["shipped", "proj"], help="rmt: the write as shipped or projected"
)
p.add_argument("--phi", default="dpfp", choices=["dpfp", "elu"])
p.add_argument("--d-mem", type=int, default=32)
p.add_argument("--m", type=int, default=16, help="armt --write mem: memory tokens; tok: slots; rmt: memory tokens")
p.add_argument("--tok-layer", type=int, default=-1, help="tok: hidden state used for the scores (-1 = final normed)")
p.add_argument("--tau", type=float, default=1.0)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seg", type=int, default=128)
p.add_argument("--nseg", type=int, default=2)
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--minutes", type=float, default=40, help="wall-clock budget of this process (training stops)")
p.add_argument("--until", default=None, help="UTC HH:MM after which training stops")
p.add_argument("--eval-every", type=int, default=50)
p.add_argument("--eval-n", type=int, default=32)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--out", default="runs/trained-memory-probe", help="logs (JSONL) and checkpoints")
p.add_argument("--check-only", action="store_true", help="only the step-0 checks (wrapped == bare, evals)")
p.add_argument("--load", default=None, help="checkpoint whose trained parameters are loaded (with --eval-only)")
p.add_argument("--eval-only", action="store_true", help="held-out eval (memory on / disabled) of --load, then exit")
args = p.parse_args()
torch.manual_seed(args.seed)
random.seed(args.seed)
OUT = args.out
os.makedirs(os.path.join(OUT, "ckpt"), exist_ok=True)
LOG = open(os.path.join(OUT, f"{args.name}.jsonl"), "a")


def log(**kw):
    kw["utc"] = time.strftime("%H:%M:%S", time.gmtime())
    s = json.dumps(kw)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


# ----------------------------------------------------------------------------------------------------------- data
def make_batch(tok, nseg, seg, size, seed):
    """`size` passkey samples of nseg*seg tokens (prompt nseg*seg-6 + answer 6), needle inside segment 1."""
    rows, labels, pos = [], [], []
    length = nseg * seg - ANSWER_LEN
    for i in range(size):
        s = seed * 100_003 + i
        rng = random.Random(s)
        dmax = 1.0 if nseg == 1 else min(1.0, (seg - 14 - 32) / max(1, length - 32 - 12 - 12))
        for attempt in range(50):
            depth = rng.random() * dmax
            sample = passkey(tok, length, seed=s + 7919 * attempt, depth=depth, haystack="repeat")
            ins = sample.inserts[0]
            if ins.position + ins.num_tokens <= seg:
                break
            dmax *= 0.9
        else:
            raise RuntimeError("needle not placed in segment 1")
        answer = tok(" " + sample.answers[0], add_special_tokens=False)["input_ids"]
        assert len(answer) == ANSWER_LEN, answer
        rows.append(sample.input_ids + answer)
        labels.append([IGNORE] * len(sample.input_ids) + answer)
        pos.append(ins.position)
    return torch.tensor(rows), torch.tensor(labels), pos


EVAL_SEED = 10**6


# ---------------------------------------------------------------------------------------------------------- model
base, tok = smollm2()
base.eval()
for q in base.parameters():
    q.requires_grad_(False)
if args.train == "lora" or args.variant == "rmt":
    from hmt_adapters.training import add_lora

    base = add_lora(base)
causal = [mod for mod in base.modules() if type(mod).__name__ == "LlamaForCausalLM"][0]
llama = causal.model
lm_head = causal.lm_head
layers = llama.layers
D = causal.config.hidden_size
EMB = llama.embed_tokens


def rms_n(h):
    return h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)


def dpfp(x, nu=3):
    x = torch.cat([F.relu(x), F.relu(-x)], dim=-1)
    rolled = torch.cat([x.roll(shifts=j, dims=-1) for j in range(1, nu + 1)], dim=-1)
    return torch.cat([x] * nu, dim=-1) * rolled


class ARMT(nn.Module):
    def __init__(self, n_layers, d, d_mem, phi, m=0):
        super().__init__()
        self.phi = dpfp if phi == "dpfp" else (lambda x: F.elu(x) + 1)
        self.d_key = 6 * d_mem if phi == "dpfp" else d_mem
        self.Wq = nn.ModuleList([nn.Linear(d, d_mem, bias=False) for _ in range(n_layers)])
        self.Wk = nn.ModuleList([nn.Linear(d, d_mem, bias=False) for _ in range(n_layers)])
        self.Wv = nn.ModuleList([nn.Linear(d, d, bias=False) for _ in range(n_layers)])
        self.Wb = nn.ModuleList([nn.Linear(d, 1) for _ in range(n_layers)])
        self.Wo = nn.ModuleList([nn.Linear(d, d, bias=False) for _ in range(n_layers)])
        for li in range(n_layers):
            nn.init.normal_(self.Wq[li].weight, std=d**-0.5)
            self.Wk[li].weight.data.copy_(self.Wq[li].weight.data)  # tied init: a token's query matches its own key
            nn.init.normal_(self.Wv[li].weight, std=d**-0.5)
            nn.init.zeros_(self.Wb[li].weight)
            nn.init.zeros_(self.Wb[li].bias)
            nn.init.zeros_(self.Wo[li].weight)
        self.mem = nn.Parameter(torch.randn(m, d) * float(EMB.weight.std())) if m else None
        self.reset(0)
        self.reading = False
        self.writing = False
        self.write_grad = False
        self.write_slice = None  # positions of the layer output that write (None = all)
        self.wlog = []

    def reset(self, B):
        self.A = [None] * len(self.Wq)
        self.z = [None] * len(self.Wq)

    def read(self, li, h):
        A, z = self.A[li], self.z[li]
        if A is None or not self.reading:
            return h
        q = self.phi(self.Wq[li](rms_n(h)))
        num = torch.einsum("btk,bkd->btd", q, A)
        den = torch.einsum("btk,bk->bt", q, z)[..., None] + 1e-5
        return h + self.Wo[li](num / den)

    def write(self, li, h):
        if not self.writing:
            return
        with torch.set_grad_enabled(self.write_grad or torch.is_grad_enabled()):
            self._write(li, h)

    def _write(self, li, h):
        if self.write_slice is not None:
            h = h[:, self.write_slice]
        hn = rms_n(h)
        k = self.phi(self.Wk[li](hn))
        v = self.Wv[li](hn)
        beta = torch.sigmoid(self.Wb[li](hn))[..., 0]
        A, z = self.A[li], self.z[li]
        if A is None:
            A = h.new_zeros(h.shape[0], self.d_key, h.shape[-1])
            z = h.new_zeros(h.shape[0], self.d_key)
            v_old = torch.zeros_like(v)
        else:
            v_old = torch.einsum("btk,bkd->btd", k, A) / (torch.einsum("btk,bk->bt", k, z)[..., None] + 1e-5)
        A = A + (k * beta[..., None]).transpose(1, 2) @ (v - v_old)  # sum_t beta_t k_t (v_t - v_old_t)^T (bmm:
        # a 3-operand einsum here materialised [B,T,d_key,d] and cost 15 s per step)
        z = z + k.sum(1)
        if A.requires_grad:
            A.retain_grad()
        self.A[li], self.z[li] = A, z


def pre_hook(li):
    def f(module, a, kw):
        if "hidden_states" in kw:
            kw["hidden_states"] = memory.read(li, kw["hidden_states"])
        else:
            a = (memory.read(li, a[0]),) + tuple(a[1:])
        return a, kw

    return f


def post_hook(li):
    def f(module, a, kw, out):
        h = out[0] if isinstance(out, tuple) else out
        memory.write(li, h)

    return f


class TokMem(nn.Module):
    def __init__(self, d, k, d_s=64):
        super().__init__()
        self.Ws = nn.Linear(d, d_s, bias=False)
        nn.init.normal_(self.Ws.weight, std=d**-0.5)
        self.q = nn.Parameter(torch.randn(k, d_s))
        self.k = k


memory = None
if args.variant == "armt":
    memory = ARMT(len(layers), D, args.d_mem, args.phi, args.m if args.write == "mem" else 0)
    for li, layer in enumerate(layers):
        layer.register_forward_pre_hook(pre_hook(li), with_kwargs=True)
        layer.register_forward_hook(post_hook(li), with_kwargs=True)
elif args.variant == "tok":
    memory = TokMem(D, args.m)
elif args.variant == "rmt":
    model = ha.wrap_with_memory(base, "rmt", segment_length=args.seg, freeze_backbone=True, num_memory_tokens=args.m)
    memory = model.memory
    rmt_grad, rmt_disable = {}, {"on": False}
    _orig_write = model.memory.tokens.write

    write_proj = None
    if args.rmt_write == "proj":  # a learned projection to the token embeddings' scale (registered: trained, saved)
        write_proj = nn.Linear(D, D, bias=False)
        nn.init.eye_(write_proj.weight)
        model.memory.write_proj = write_proj
        emb_rms = float(EMB.weight.float().pow(2).mean().sqrt())

    def rmt_write(state, hidden):
        new = _orig_write(state, hidden)
        if write_proj is not None:
            new = dict(new, memory=write_proj(rms_n(new["memory"])) * emb_rms)
        h = new["memory"]
        if h.requires_grad:
            k = len(rmt_grad)
            h.register_hook(lambda g, k=k: rmt_grad.__setitem__(k, float(g.norm())))
        if rmt_disable["on"]:  # memory disabled: the next segment reads memory_init as if it were the first
            new = dict(new, memory_valid=torch.zeros_like(new["memory_valid"]))
        return new

    model.memory.tokens.write = rmt_write

HIDDEN = {}


def run_llama(embeds, positions=None, past=None, use_cache=False, want_hidden_layer=None):
    B, T, _ = embeds.shape
    if positions is None:
        positions = torch.arange(T).unsqueeze(0).expand(B, -1)
    kw = dict(inputs_embeds=embeds, position_ids=positions, use_cache=use_cache)
    if past is not None:
        kw["past_key_values"] = past
    if want_hidden_layer is not None and want_hidden_layer >= 0:
        kw["output_hidden_states"] = True
    out = llama(**kw)
    return out


def answer_logits(h_last):
    """logits at the 6 positions that predict the answer (the last 7..2 of the final window)."""
    return lm_head(h_last[:, -ANSWER_LEN - 1 : -1]).float()


def forward(ids, labels, mem_on=True):
    """Answer logits [B, 6, V] and extra diagnostics."""
    B, T = ids.shape
    seg = args.seg
    info = {}
    if args.variant == "sanity":
        with torch.no_grad():
            h = run_llama(EMB(ids)).last_hidden_state
        return answer_logits(h), info
    if args.variant == "rmt":
        model.train(torch.is_grad_enabled())
        rmt_grad.clear()
        rmt_disable["on"] = not mem_on
        out = model(ids, labels=labels)
        rmt_disable["on"] = False
        lg = out.logits[:, -ANSWER_LEN - 1 : -1].float()
        info["rmt_out"] = out
        return lg, info
    segs = [ids[:, i * seg : (i + 1) * seg] for i in range(args.nseg)]
    bb_grad = args.train == "lora" and torch.is_grad_enabled()
    if args.variant == "armt":
        memory.reset(B)
        for i, s in enumerate(segs):
            last = i == len(segs) - 1
            memory.reading = mem_on and i > 0
            emb = EMB(s)
            if args.write == "all":
                memory.writing = (not last) and mem_on
                memory.write_slice = None
                memory.write_grad = torch.is_grad_enabled()  # the write projections train even when the
                with torch.set_grad_enabled(torch.is_grad_enabled() and (bb_grad or i > 0)):  # backbone pass is
                    h = run_llama(emb).last_hidden_state  # no-grad (segment 1, frozen backbone, empty memory)
            else:  # mem tokens appended after the segment write
                memory.writing = False
                memory.write_grad = torch.is_grad_enabled()
                if last:
                    h = run_llama(emb).last_hidden_state
                else:
                    mem = memory.mem.unsqueeze(0).expand(B, -1, -1).to(emb.dtype)
                    L = s.shape[1]
                    if bb_grad or i > 0:
                        memory.writing = mem_on
                        memory.write_slice = slice(L, None)
                        run_llama(torch.cat([emb, mem], 1))
                    else:  # segment tokens do not depend on the memory tokens: no-grad pass with cache
                        with torch.no_grad():
                            o = run_llama(emb, use_cache=True)
                        memory.writing = mem_on
                        memory.write_slice = None
                        pos = torch.arange(L, L + mem.shape[1]).unsqueeze(0).expand(B, -1)
                        run_llama(mem, positions=pos, past=o.past_key_values, use_cache=True)
                    memory.writing = False
            memory.reading = False
        memory.writing = False
        return answer_logits(h), info
    if args.variant == "tok":
        s1, s2 = segs
        L = s1.shape[1]
        with torch.set_grad_enabled(torch.is_grad_enabled() and bb_grad):
            o = run_llama(EMB(s1), want_hidden_layer=args.tok_layer)
            hs = o.last_hidden_state if args.tok_layer < 0 else o.hidden_states[args.tok_layer]
        e1 = EMB(s1)  # candidates: segment 1's input embeddings [B, L, d]
        sc = torch.einsum("jd,btd->bjt", memory.q, memory.Ws(rms_n(hs.detach() if not bb_grad else hs)))
        sc = sc / math.sqrt(memory.q.shape[1])
        if torch.is_grad_enabled():
            u = torch.rand_like(sc).clamp(1e-9, 1 - 1e-7)
            g = -torch.log(-torch.log(u))  # Gumbel(0, 1)
            soft = torch.softmax((sc + g) / args.tau, -1)
        else:
            soft = torch.softmax(sc / args.tau, -1)
        idx = soft.argmax(-1)  # [B, k]
        hard = F.one_hot(idx, L).to(soft.dtype)
        w = hard + soft - soft.detach()  # straight-through
        order = idx.argsort(-1)  # slots in the order of the positions they point to
        w = torch.gather(w, 1, order[..., None].expand(-1, -1, L))
        slots = w @ e1  # [B, k, d]
        if slots.requires_grad:
            slots.retain_grad()
        info["slots"], info["idx"] = slots, torch.gather(idx, 1, order)
        if os.environ.get("PROFILE"):
            print("DEBUG nan", [bool(t.isnan().any()) for t in (hs, sc, soft, w, slots)], flush=True)
        emb2 = EMB(s2)
        x = torch.cat([slots, emb2], 1) if mem_on else emb2
        h = run_llama(x).last_hidden_state
        return answer_logits(h), info


def metrics(lg, labels):
    tgt = labels[:, -ANSWER_LEN:]
    nll = F.cross_entropy(lg.transpose(1, 2), tgt, reduction="none")  # [B, 6]
    hit = lg.argmax(-1) == tgt
    return nll, hit


def wilson(k, n, z=1.96):
    ph = k / n
    den = 1 + z * z / n
    c = (ph + z * z / (2 * n)) / den
    r = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / den
    return [round(max(0, c - r), 3), round(min(1, c + r), 3)]


EVAL_SETS = None


def evaluate(step, mem_on=True):
    global EVAL_SETS
    nseg = 1 if args.variant == "sanity" else args.nseg
    if EVAL_SETS is None:
        EVAL_SETS = [make_batch(tok, nseg, args.seg, 8, EVAL_SEED + s) for s in range(0, args.eval_n, 8)]
    nlls, hits, idxs = [], [], []
    with torch.no_grad():
        for ids, labels, pos in EVAL_SETS:
            lg, info = forward(ids, labels, mem_on=mem_on)
            nll, hit = metrics(lg, labels)
            nlls.append(nll)
            hits.append(hit)
            if "idx" in info:
                idxs.append([(info["idx"][b].tolist(), pos[b]) for b in range(min(2, len(pos)))])
    nll, hit = torch.cat(nlls), torch.cat(hits)
    ex = int(hit[:, 1:].all(-1).sum())
    n = nll.shape[0]
    rec = dict(
        type="eval",
        step=step,
        memory="on" if mem_on else "disabled",
        exact=ex,
        n=n,
        wilson95=wilson(ex, n),
        exact_with_space=int(hit.all(-1).sum()),
        digit_acc=round(float(hit[:, 1:].float().mean()), 3),
        answer_loss=round(float(nll.mean()), 4),
        digit_nll=round(float(nll[:, 1:].mean()), 4),
    )
    if idxs:
        rec["pointer_positions_vs_needle"] = idxs[0]
    log(**rec)
    return rec


# ------------------------------------------------------------------------------------------------------- training
if args.variant == "rmt":
    params = [q for q in model.parameters() if q.requires_grad]
else:
    params = [q for q in memory.parameters()] if memory is not None else []
    if args.train == "lora":
        params += [q for q in base.parameters() if q.requires_grad]
n_params = sum(q.numel() for q in params)
log(
    type="config",
    args=vars(args),
    trainable_tensors=len(params),
    trainable_params=n_params,
    plateau=round(PLATEAU, 4),
    torch_threads=torch.get_num_threads(),
)

# step-0 check: wrapped == bare (answer logits of the final window vs the bare model on that window alone, and the
# whole window's logits for the armt/tok variants with memory on)
if args.variant in ("armt", "tok", "rmt"):
    ids, labels, _ = make_batch(tok, args.nseg, args.seg, 2, 424242)
    with torch.no_grad():
        lg, _ = forward(ids, labels, mem_on=True)
        bare_h = llama(inputs_embeds=EMB(ids[:, -args.seg :])).last_hidden_state
        bare = lm_head(bare_h[:, -ANSWER_LEN - 1 : -1]).float()
        bare_full = lm_head(llama(inputs_embeds=EMB(ids)).last_hidden_state[:, -ANSWER_LEN - 1 : -1]).float()
        if args.variant == "armt":  # whole last-segment logits
            memory.reset(2)
            memory.reading = False
            memory.writing = True
            memory.write_slice = None
            run_llama(EMB(ids[:, : args.seg]))
            memory.writing = False
            memory.reading = True
            h2 = run_llama(EMB(ids[:, args.seg : 2 * args.seg])).last_hidden_state
            memory.reading = False
            d_all = float((lm_head(h2).float() - lm_head(bare_h if args.nseg == 2 else h2).float()).abs().max())
        else:
            d_all = None
    log(
        type="check",
        what="step-0 answer logits, wrapped (memory on) vs bare SmolLM2 on the last segment alone",
        max_abs_logit_diff=float((lg - bare).abs().max()),
        max_abs_logit_diff_whole_segment=d_all,
        bare_last_segment_exact=int((bare.argmax(-1) == labels[:, -ANSWER_LEN:])[:, 1:].all(-1).sum()),
        bare_full_context_exact=int((bare_full.argmax(-1) == labels[:, -ANSWER_LEN:])[:, 1:].all(-1).sum()),
    )

if args.variant == "sanity":
    evaluate(0)
    # the bare model with 2 segments of context in ONE window (full attention) and on the last segment alone
    ids, labels, pos = make_batch(tok, 2, args.seg, args.eval_n, EVAL_SEED)
    with torch.no_grad():
        hits_full, hits_last = [], []
        for b in range(0, args.eval_n, 8):
            x = ids[b : b + 8]
            hits_full.append(
                metrics(answer_logits(llama(inputs_embeds=EMB(x)).last_hidden_state), labels[b : b + 8])[1]
            )
            hits_last.append(
                metrics(
                    answer_logits(llama(inputs_embeds=EMB(x[:, -args.seg :])).last_hidden_state), labels[b : b + 8]
                )[1]
            )
    for nm, hh in (("2-seg prompt in one window (full attention)", hits_full), ("last segment alone", hits_last)):
        hh = torch.cat(hh)
        ex = int(hh[:, 1:].all(-1).sum())
        log(
            type="eval",
            what=nm,
            exact=ex,
            n=args.eval_n,
            wilson95=wilson(ex, args.eval_n),
            digit_acc=round(float(hh[:, 1:].float().mean()), 3),
        )
    sys.exit(0)

if args.eval_only:
    st = torch.load(args.load, weights_only=False)
    for q, v in zip(params, st["params"]):
        q.data.copy_(v)
    log(type="loaded", path=args.load, trained_steps=st["step"])
    evaluate(st["step"], True)
    evaluate(st["step"], False)
    sys.exit(0)
opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
ck = os.path.join(OUT, "ckpt", f"{args.name}.pt")
start = 1
if os.path.exists(ck):
    st = torch.load(ck, weights_only=False)
    for q, v in zip(params, st["params"]):
        q.data.copy_(v)
    opt.load_state_dict(st["opt"])
    start = st["step"] + 1
    log(type="resume", step=st["step"])
elif not os.environ.get("PROFILE"):
    evaluate(0, True)
    evaluate(0, False)
if args.check_only:
    sys.exit(0)


def write_grad_norm(info):
    if args.variant == "armt":
        gs = [a.grad for a in memory.A if a is not None and a.grad is not None]
        at_A = math.sqrt(sum(float(g.pow(2).sum()) for g in gs)) if gs else 0.0
        wk = [q.grad for m_ in (memory.Wk, memory.Wv, memory.Wb) for q in m_.parameters() if q.grad is not None]
        at_W = math.sqrt(sum(float(g.pow(2).sum()) for g in wk)) if wk else 0.0
        return {"grad_at_A": at_A, "grad_write_params": at_W}
    if args.variant == "tok":
        g = info["slots"].grad
        sg = [q.grad for q in memory.parameters() if q.grad is not None]
        return {
            "grad_at_slots": float(g.norm()) if g is not None else 0.0,
            "grad_scorer_params": math.sqrt(sum(float(x.pow(2).sum()) for x in sg)) if sg else 0.0,
        }
    if args.variant == "rmt":
        return {"grad_at_writes": [round(rmt_grad.get(k, 0.0), 5) for k in range(len(rmt_grad))]}
    return {}


t_start = time.time()
deadline = t_start + 60 * args.minutes
if args.until:
    hh, mm = map(int, args.until.split(":"))
    now = time.gmtime()
    until = time.time() + ((hh * 60 + mm) - (now.tm_hour * 60 + now.tm_min)) * 60 - now.tm_sec
    deadline = min(deadline, until)
step = start - 1
for step in range(start, args.steps + 1):
    c0, w0 = time.process_time(), time.time()
    ids, labels, pos = make_batch(tok, args.nseg, args.seg, args.batch, step + 1000 * args.seed)
    lg, info = forward(ids, labels)
    nll, hit = metrics(lg, labels)
    loss = nll.mean()
    opt.zero_grad(set_to_none=True)
    c1 = time.process_time()
    loss.backward()
    if os.environ.get("PROFILE"):
        print("PROFILE forward cpu", c1 - c0, "backward cpu", time.process_time() - c1, flush=True)
    wg = write_grad_norm(info)
    gn = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
    opt.step()
    rec = dict(
        type="step",
        step=step,
        loss=round(float(loss), 4),
        digit_nll=round(float(nll[:, 1:].mean()), 4),
        digit_acc=round(float(hit[:, 1:].float().mean()), 3),
        grad_norm=round(gn, 4),
        **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in wg.items()},
        cpu_s=round(time.process_time() - c0, 2),
        wall_s=round(time.time() - w0, 2),
    )
    if "idx" in info:
        rec["pointer_row0"] = info["idx"][0].tolist()
        rec["needle_row0"] = pos[0]
    log(**rec)
    if step % args.eval_every == 0:
        evaluate(step, True)
        torch.save({"params": [q.detach().clone() for q in params], "opt": opt.state_dict(), "step": step}, ck)
    if time.time() > deadline:
        break
if step % args.eval_every != 0:
    evaluate(step, True)
    evaluate(step, False)
    torch.save({"params": [q.detach().clone() for q in params], "opt": opt.state_dict(), "step": step}, ck)
log(type="done", step=step, wall_s=round(time.time() - t_start, 1))
