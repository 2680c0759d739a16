#!/usr/bin/env python3
"""Writes the allocation trace of a few training steps of a decoder-only
transformer, as a device allocator would see it under mixed precision.

Usage: gen_training_trace.py [OUTPUT]   (default: training_step.trace beside
this script). The output is deterministic: the same seed and parameters
always give the same bytes.

Format, one operation per line:
    # ...            comments (the first line describes the trace)
    a <id> <bytes>   allocate a buffer of <bytes> bytes named <id>
    f <id>           free buffer <id>
Ids are decimal, start at 1, and are never reused. Every buffer allocated
is freed by the end (the last lines tear the model down), so a replay ends
with nothing live.

What happens, in order:
 - the model's parameters are allocated once, in fp32 (master weights):
   token and position embeddings (the output projection is tied to the
   token embedding), per layer two layer norms, the fused QKV projection,
   the attention output projection and the two MLP projections, each with
   its bias, and a final layer norm;
 - each optimizer step runs MICRO_BATCHES forward/backward passes of BATCH
   sequences whose length is drawn per pass (padded batches of varying
   length, as a data loader without packing gives);
 - forward, layer by layer: bf16 copies of the layer's weights (the
   autocast cache, kept until the layer's backward), then the saved
   activations in forward order (layer-norm outputs and statistics, QKV,
   attention output and log-sum-exp, dropout masks, residual outputs, the
   MLP's up projection and activation), with short-lived temporaries
   between them (projection outputs before the residual add, layout
   copies, reduction scratch);
 - the loss: bf16 logits over the vocabulary, an fp32 upcast, fp32 log
   probabilities, a per-token loss, the scalar loss (the largest buffers of
   the trace);
 - backward, layers in reverse: gradients with respect to activations are
   allocated and freed a few operations later; each layer's saved
   activations and bf16 weight copies are freed once its backward is done;
   parameter gradients (fp32, parameter sizes) are allocated the first time
   a micro-batch reaches them (with a bf16 temporary for the weight
   gradient before it is accumulated) and live until the optimizer step;
 - the optimizer step: gradient-norm clipping (a scalar per parameter,
   stacked, a total), then Adam: its two fp32 moment buffers per parameter
   are created on the first step, and each step makes the foreach
   temporaries (the square root of the second moment, one per parameter,
   all live at once) and frees them; then the gradients are freed (zero_grad
   with set_to_none).

Peak bytes live (the sum of the sizes of live buffers) and the number of
operations are written into the header line.
"""

import os
import random
import sys

SEED = 20240917

# Model: a GPT-style decoder. Element sizes: fp32 = 4, bf16 = 2, int64 = 8,
# bool = 1.
HIDDEN = 1024
FFN = 4 * HIDDEN
HEADS = 16
LAYERS = 12
VOCAB = 32000
MAX_SEQ = 1024

# Training loop.
BATCH = 4
SEQ_CHOICES = (512, 640, 768, 896, 1024)
MICRO_BATCHES = 2
STEPS = 6

FP32, BF16, INT64, BOOL = 4, 2, 8, 1


class Trace:
    """Allocation bookkeeping; writes the op lines."""

    def __init__(self, rng):
        self.rng = rng
        self.lines = []
        self.next_id = 1
        self.live = {}  # id -> bytes
        self.live_bytes = 0
        self.peak_live = 0
        self.peak_buffers = 0
        self.allocs = 0
        self.pending = []  # (due op count, id) of temporaries
        self.ops = 0

    def alloc(self, size):
        assert size > 0
        bid = self.next_id
        self.next_id += 1
        self.lines.append("a %d %d" % (bid, size))
        self.live[bid] = size
        self.live_bytes += size
        self.allocs += 1
        self.peak_live = max(self.peak_live, self.live_bytes)
        self.peak_buffers = max(self.peak_buffers, len(self.live))
        self._tick()
        return bid

    def free(self, bid):
        if bid is None:
            return
        self.lines.append("f %d" % bid)
        self.live_bytes -= self.live.pop(bid)
        self._tick()

    def free_all(self, ids):
        for bid in ids:
            self.free(bid)

    def temp(self, size, life=None):
        """A temporary freed `life` operations later (1..4 when None)."""
        if life is None:
            life = self.rng.randint(1, 4)
        bid = self.alloc(size)
        self.pending.append((self.ops + life, bid))
        return bid

    def scratch(self):
        """A small short-lived buffer: a reduction result, an index list,
        a scalar, a cuBLAS-style workspace."""
        kind = self.rng.random()
        if kind < 0.3:
            size = 4 * self.rng.choice((1, 2, 4, 16))
        elif kind < 0.7:
            size = self.rng.choice((512, 1024, 2048, 4096, 8192, 16384))
        elif kind < 0.95:
            size = self.rng.choice((32, 64, 128, 256)) * 1024
        else:
            size = self.rng.choice((1, 2, 4, 8)) << 20
        self.temp(size)

    def maybe_scratch(self, p=0.5):
        if self.rng.random() < p:
            self.scratch()

    def _tick(self):
        self.ops += 1
        if not self.pending:
            return
        due = [p for p in self.pending if p[0] <= self.ops]
        if not due:
            return
        self.pending = [p for p in self.pending if p[0] > self.ops]
        for _, bid in due:
            self.free(bid)

    def drain(self):
        while self.pending:
            _, bid = self.pending.pop(0)
            self.free(bid)


def parameter_shapes():
    """(name, elements) of every parameter, in module order."""
    params = [("wte", VOCAB * HIDDEN), ("wpe", MAX_SEQ * HIDDEN)]
    for i in range(LAYERS):
        p = "h%d." % i
        params += [
            (p + "ln1.w", HIDDEN),
            (p + "ln1.b", HIDDEN),
            (p + "qkv.w", 3 * HIDDEN * HIDDEN),
            (p + "qkv.b", 3 * HIDDEN),
            (p + "proj.w", HIDDEN * HIDDEN),
            (p + "proj.b", HIDDEN),
            (p + "ln2.w", HIDDEN),
            (p + "ln2.b", HIDDEN),
            (p + "fc1.w", FFN * HIDDEN),
            (p + "fc1.b", FFN),
            (p + "fc2.w", HIDDEN * FFN),
            (p + "fc2.b", HIDDEN),
        ]
    params += [("lnf.w", HIDDEN), ("lnf.b", HIDDEN)]
    return params


LAYER_PARAMS = ("ln1.w", "ln1.b", "qkv.w", "qkv.b", "proj.w", "proj.b",
                "ln2.w", "ln2.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b")


class Trainer:
    def __init__(self, tr):
        self.tr = tr
        self.shapes = dict(parameter_shapes())
        self.order = [n for n, _ in parameter_shapes()]
        self.param = {}
        self.grad = {}
        self.exp_avg = {}
        self.exp_avg_sq = {}
        self.workspace = None

    def setup(self):
        for name in self.order:
            self.param[name] = self.tr.alloc(self.shapes[name] * FP32)

    def matmul(self):
        """The first matrix product creates a workspace kept for good."""
        if self.workspace is None:
            self.workspace = self.tr.alloc(32 << 20)
        self.tr.maybe_scratch(0.3)

    def grad_of(self, name):
        """Accumulates into the parameter's fp32 gradient, creating it on
        the first micro-batch; weight matrices go through a bf16
        temporary."""
        n = self.shapes[name]
        if n >= HIDDEN * HIDDEN:
            self.tr.temp(n * BF16, life=1)
        elif self.tr.rng.random() < 0.5:
            self.tr.temp(n * FP32, life=1)
        if name not in self.grad:
            self.grad[name] = self.tr.alloc(n * FP32)

    # --- forward ---

    def layer_forward(self, i, T, S, x):
        tr = self.tr
        p = "h%d." % i
        saved = {}
        # autocast: bf16 copies of the weights, saved for backward
        casts = [tr.alloc(self.shapes[p + n] * BF16) for n in LAYER_PARAMS
                 if not n.startswith("ln")]
        # attention block
        saved["ln1_mean"] = tr.alloc(T * FP32)
        saved["ln1_rstd"] = tr.alloc(T * FP32)
        saved["ln1_out"] = tr.alloc(T * HIDDEN * BF16)
        tr.maybe_scratch()
        self.matmul()
        saved["qkv"] = tr.alloc(T * 3 * HIDDEN * BF16)
        # head-major layout copies of q, k, v for the attention kernel
        for _ in range(3):
            tr.temp(T * HIDDEN * BF16, life=3)
        saved["attn_out"] = tr.alloc(T * HIDDEN * BF16)
        saved["lse"] = tr.alloc(BATCH * HEADS * S * FP32)
        saved["rng"] = tr.alloc(16)
        tr.maybe_scratch()
        self.matmul()
        proj = tr.alloc(T * HIDDEN * BF16)
        saved["drop1"] = tr.alloc(T * HIDDEN * BOOL)
        saved["h_mid"] = tr.alloc(T * HIDDEN * BF16)
        tr.free(proj)
        # MLP block
        saved["ln2_mean"] = tr.alloc(T * FP32)
        saved["ln2_rstd"] = tr.alloc(T * FP32)
        saved["ln2_out"] = tr.alloc(T * HIDDEN * BF16)
        self.matmul()
        saved["fc1"] = tr.alloc(T * FFN * BF16)
        saved["gelu"] = tr.alloc(T * FFN * BF16)
        tr.maybe_scratch()
        self.matmul()
        fc2 = tr.alloc(T * HIDDEN * BF16)
        saved["drop2"] = tr.alloc(T * HIDDEN * BOOL)
        out = tr.alloc(T * HIDDEN * BF16)
        tr.free(fc2)
        tr.maybe_scratch()
        saved["x"] = x
        return out, saved, casts

    def forward(self, T, S):
        tr = self.tr
        batch = {
            "ids": tr.alloc(T * INT64),
            "labels": tr.alloc(T * INT64),
            "pos": tr.alloc(S * INT64),
        }
        tok = tr.alloc(T * HIDDEN * FP32)
        tr.temp(S * HIDDEN * FP32, life=2)  # position embeddings
        h = tr.alloc(T * HIDDEN * BF16)
        tr.free(tok)
        batch["drop0"] = tr.alloc(T * HIDDEN * BOOL)
        layers = []
        for i in range(LAYERS):
            out, saved, casts = self.layer_forward(i, T, S, h)
            layers.append((saved, casts))
            h = out
        head = {"x": h}
        head["lnf_mean"] = tr.alloc(T * FP32)
        head["lnf_rstd"] = tr.alloc(T * FP32)
        head["lnf_out"] = tr.alloc(T * HIDDEN * BF16)
        head["wte16"] = tr.alloc(VOCAB * HIDDEN * BF16)
        self.matmul()
        head["logits"] = tr.alloc(T * VOCAB * BF16)
        up = tr.alloc(T * VOCAB * FP32)
        head["logp"] = tr.alloc(T * VOCAB * FP32)
        tr.free(up)
        nll = tr.alloc(T * FP32)
        tr.temp(T * BOOL, life=1)  # ignore-index mask
        loss = tr.alloc(FP32)
        tr.free(nll)
        return batch, layers, head, loss

    # --- backward ---

    def layer_backward(self, i, T, S, d_out, saved, casts):
        tr = self.tr
        p = "h%d." % i
        # MLP block
        d_fc2 = tr.alloc(T * HIDDEN * BF16)
        tr.free(saved.pop("drop2"))
        self.matmul()
        self.grad_of(p + "fc2.w")
        self.grad_of(p + "fc2.b")
        d_gelu = tr.alloc(T * FFN * BF16)
        tr.free(d_fc2)
        d_fc1 = tr.alloc(T * FFN * BF16)
        tr.free(d_gelu)
        tr.free(saved.pop("gelu"))
        self.matmul()
        self.grad_of(p + "fc1.w")
        self.grad_of(p + "fc1.b")
        d_ln2 = tr.alloc(T * HIDDEN * BF16)
        tr.free(d_fc1)
        tr.free(saved.pop("fc1"))
        tr.maybe_scratch()
        d_mid = tr.alloc(T * HIDDEN * BF16)
        self.grad_of(p + "ln2.w")
        self.grad_of(p + "ln2.b")
        tr.free(d_ln2)
        for k in ("ln2_out", "ln2_mean", "ln2_rstd"):
            tr.free(saved.pop(k))
        tr.free(d_out)  # added into d_mid (residual)
        # attention block
        d_proj = tr.alloc(T * HIDDEN * BF16)
        tr.free(saved.pop("drop1"))
        self.matmul()
        self.grad_of(p + "proj.w")
        self.grad_of(p + "proj.b")
        d_attn = tr.alloc(T * HIDDEN * BF16)
        tr.free(d_proj)
        # attention backward: fp32 dq accumulator and softmax row sums
        tr.temp(T * HIDDEN * FP32, life=2)
        tr.temp(BATCH * HEADS * S * FP32, life=2)
        d_qkv = tr.alloc(T * 3 * HIDDEN * BF16)
        tr.free(d_attn)
        for k in ("attn_out", "lse", "rng"):
            tr.free(saved.pop(k))
        self.matmul()
        self.grad_of(p + "qkv.w")
        self.grad_of(p + "qkv.b")
        d_ln1 = tr.alloc(T * HIDDEN * BF16)
        tr.free(d_qkv)
        tr.free(saved.pop("qkv"))
        tr.maybe_scratch()
        d_x = tr.alloc(T * HIDDEN * BF16)
        self.grad_of(p + "ln1.w")
        self.grad_of(p + "ln1.b")
        tr.free(d_ln1)
        for k in ("ln1_out", "ln1_mean", "ln1_rstd"):
            tr.free(saved.pop(k))
        tr.free(d_mid)  # added into d_x (residual)
        tr.free(saved.pop("h_mid"))
        tr.free_all(casts)
        x = saved.pop("x")
        assert not saved
        return d_x, x

    def backward(self, T, S, batch, layers, head, loss):
        tr = self.tr
        d_loss = tr.alloc(FP32)
        tr.free(loss)
        d_logp = tr.alloc(T * VOCAB * FP32)
        tr.free(d_loss)
        d_logits = tr.alloc(T * VOCAB * BF16)
        tr.free(d_logp)
        tr.free(head.pop("logp"))
        self.matmul()
        self.grad_of("wte")  # the tied output projection
        d_lnf = tr.alloc(T * HIDDEN * BF16)
        tr.free(d_logits)
        tr.free(head.pop("logits"))
        tr.free(head.pop("wte16"))
        d_h = tr.alloc(T * HIDDEN * BF16)
        self.grad_of("lnf.w")
        self.grad_of("lnf.b")
        tr.free(d_lnf)
        for k in ("lnf_out", "lnf_mean", "lnf_rstd"):
            tr.free(head.pop(k))
        x = head.pop("x")
        for i in reversed(range(LAYERS)):
            saved, casts = layers[i]
            d_h, x_in = self.layer_backward(i, T, S, d_h, saved, casts)
            tr.free(x)  # this layer's output, no longer needed
            x = x_in
        # embeddings
        tr.free(batch.pop("drop0"))
        d_emb = tr.alloc(T * HIDDEN * FP32)
        tr.free(d_h)
        tr.temp(VOCAB * HIDDEN * FP32, life=1)  # dense embedding gradient
        self.grad_of("wte")
        tr.temp(S * HIDDEN * FP32, life=1)
        self.grad_of("wpe")
        tr.free(d_emb)
        tr.free(x)
        for k in ("ids", "labels", "pos"):
            tr.free(batch.pop(k))
        tr.drain()

    # --- optimizer ---

    def optimizer_step(self):
        tr = self.tr
        names = [n for n in self.order if n in self.grad]
        # clip_grad_norm_: a norm per gradient, stacked, a total, a factor
        norms = [tr.alloc(FP32) for _ in names]
        stacked = tr.alloc(len(names) * FP32)
        tr.free_all(norms)
        total = tr.alloc(FP32)
        tr.free(stacked)
        coef = tr.alloc(FP32)
        tr.free(total)
        tr.free(coef)
        # Adam: moments created on the first step, in parameter order
        for n in names:
            if n not in self.exp_avg:
                self.exp_avg[n] = tr.alloc(self.shapes[n] * FP32)
                self.exp_avg_sq[n] = tr.alloc(self.shapes[n] * FP32)
        tr.maybe_scratch()
        denom = [tr.alloc(self.shapes[n] * FP32) for n in names]
        tr.maybe_scratch()
        tr.free_all(denom)
        tr.drain()
        # zero_grad(set_to_none=True)
        for n in names:
            tr.free(self.grad.pop(n))

    def teardown(self):
        tr = self.tr
        if self.workspace is not None:
            tr.free(self.workspace)
        for n in self.order:
            if n in self.exp_avg:
                tr.free(self.exp_avg.pop(n))
                tr.free(self.exp_avg_sq.pop(n))
        for n in self.order:
            tr.free(self.param.pop(n))


def generate():
    rng = random.Random(SEED)
    tr = Trace(rng)
    model = Trainer(tr)
    model.setup()
    seqs = []
    for step in range(STEPS):
        for micro in range(MICRO_BATCHES):
            # the longest sequence length comes up at least once
            if step == 1 and micro == 0:
                S = MAX_SEQ
            else:
                S = rng.choice(SEQ_CHOICES)
            seqs.append(S)
            T = BATCH * S
            batch, layers, head, loss = model.forward(T, S)
            model.backward(T, S, batch, layers, head, loss)
        model.optimizer_step()
    model.teardown()
    assert not tr.live and not tr.pending
    return tr, seqs


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "training_step.trace")
    tr, seqs = generate()
    n_params = sum(n for _, n in parameter_shapes())
    header = (
        "# training-step allocation trace (gen_training_trace.py, seed %d): "
        "GPT-style decoder, %d layers, hidden %d, ffn %d, %d heads, vocab %d, "
        "%.1fM fp32 parameters, Adam, bf16 autocast; %d optimizer steps x %d "
        "micro-batches of %d sequences, lengths %s; %d ops (%d allocations), "
        "peak live %d bytes (%.2f GiB) in at most %d buffers; "
        "format: 'a <id> <bytes>' / 'f <id>'"
        % (SEED, LAYERS, HIDDEN, FFN, HEADS, VOCAB, n_params / 1e6, STEPS,
           MICRO_BATCHES, BATCH, ",".join(str(s) for s in seqs),
           len(tr.lines), tr.allocs, tr.peak_live, tr.peak_live / 2**30,
           tr.peak_buffers))
    with open(out, "w", newline="\n") as f:
        f.write(header + "\n")
        for line in tr.lines:
            f.write(line + "\n")
    sys.stderr.write("%s: %d ops, peak live %.2f GiB\n"
                     % (out, len(tr.lines), tr.peak_live / 2**30))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
