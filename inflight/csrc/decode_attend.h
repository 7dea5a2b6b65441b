/* decode_kernel.c's attention and the per-layer pieces around it: attend() (its scalar reference loops,
 * attend_vec.h's vector passes), a head's rotary and K / V write, the residual add, the norm rows.
 * Included once, in place, by decode_kernel.c, after Dims. */
#ifndef IFL_DECODE_ATTEND_H
#define IFL_DECODE_ATTEND_H

/* Position p's K / V row offset in the pool (from `row`, the sequence's block table) and in *end
 * the end of p's block: positions a block at a time, one division per block, not a / and a % per
 * position and pass (Qwen2.5-0.5B shape, 130-160 positions, Zen 4: the step's attention 0.62 -> 0.46
 * ms a thread) */
static inline long block_base(const int64_t *row, int p, int bs, int len, int *end) {
    const int blk = p / bs;
    *end = (blk + 1) * bs < len ? (blk + 1) * bs : len;
    return (long)row[blk] * bs - (long)blk * bs;
}

/* The scalar loops attend_vec.h's att_scores_heads / att_pv_heads run several positions at a time
 * (the reference for their bits: -DIFL_ATTN_REF builds these alone). Scores of nh heads (q: nh x
 * hd) over positions start .. len - 1, each head's max in mx */
static void scores_scalar(const float *q, int nh, int hd, float scale, const st_t *K, const int64_t *row, int bs,
                          int start, int len, float *scores, float *mx) {
    const int n = len - start;
    for (int p = start, end; p < len;)
        for (const long base = block_base(row, p, bs, len, &end); p < end; ++p)
            for (int g = 0; g < nh; ++g) {
                float s = dot_q(q + (size_t)g * hd, K + (base + p) * hd, hd) * scale;
                scores[(size_t)g * n + p - start] = s;
                if (s > mx[g]) mx[g] = s;
            }
}

/* o (nh x hd, zeroed) += R(pr) . V over the same positions (pr: nh x n probabilities) */
static void pv_scalar(const st_t *V, const int64_t *row, int start, int len, int bs, int hd, int nh, const float *pr,
                      int n, float *o) {
    for (int p = start, end; p < len;)
        for (const long base = block_base(row, p, bs, len, &end); p < end; ++p)
            for (int g = 0; g < nh; ++g) {
                const st_t *v = V + (base + p) * hd;
                const float w = R(pr[(size_t)g * n + p - start]);
                for (int i = 0; i < hd; ++i) o[(size_t)g * hd + i] += w * LD(v[i]);
            }
}

/* Query heads h0 .. h0 + nh - 1 of row m (all of one key head's group) over its context, as
 * PyTorch's CPU flash attention (what Hugging Face runs through SDPA) computes a decode: scores
 * q.k * scale and the softmax in float32; in a bf16 model the unnormalised probabilities are
 * rounded to bf16 for the P.V product; one division at the end. Each K and V row is read once for
 * all nh heads (a batch-1 step passes a key head's whole group: 7 heads on Qwen2.5-0.5B), and each
 * head's scores, max, sum and P.V run in the same order whatever nh: the same bits one head at a
 * time. scores: nh x the context's positions; out: head h0's output, the others after it.
 * attend_vec.h runs the same operations several positions / outputs at a time (0.5B Q8_0 step, 2
 * threads, Zen 4: 0.51 -> 0.43 ms a thread; hot in cache 0.33 -> 0.16; test_decode_kernel_bits.py). */
static void attend(const Dims *d, const st_t *qkv_row, const st_t *kv, const int64_t *table, int max_blocks,
                   int m, int pos, int h0, int nh, float *scores, st_t *out) {
    const int hd = d->HD, kvh = h0 / (d->NH / d->KV);
    float q[nh][hd], o[nh][hd], mx[nh], sum[nh]; /* <= 16 x 256 x 2 floats (32 KB) on these models */
    for (int g = 0; g < nh; ++g) {
        for (int i = 0; i < hd; ++i) q[g][i] = LD(qkv_row[(h0 + g) * hd + i]);
        mx[g] = -INFINITY;
    }
    const st_t *K = kv + (size_t)kvh * d->slots * hd;
    const st_t *V = kv + ((size_t)d->KV + kvh) * d->slots * hd;
    int len = pos + 1, start = 0;
    if (d->window > 0 && len > d->window) start = len - d->window;
    const int n = len - start, bs = d->bs;
    const int64_t *row = table + (size_t)m * max_blocks;
#if defined(ATT_VEC) && !defined(IFL_ATTN_REF)
    const int vec = hd % 16 == 0;
    if (vec) att_scores_heads(&q[0][0], nh, hd, d->scale, K, row, bs, start, len, scores, mx);
#else
    const int vec = 0;
#endif
    if (!vec) scores_scalar(&q[0][0], nh, hd, d->scale, K, row, bs, start, len, scores, mx);
    /* e^(s - max) 16 / 8 at a time (vec_exp.h): scalar expf was ~15 % of the step's attention */
    for (int g = 0; g < nh; ++g) {
        sum[g] = ifl_exp_shifted(scores + (size_t)g * n, n, mx[g]);
        for (int i = 0; i < hd; ++i) o[g][i] = 0.f;
    }
#if defined(ATT_VEC) && !defined(IFL_ATTN_REF)
    if (vec) {
        att_round(scores, nh * n);
        att_pv_heads(V, row, start, len, bs, hd, nh, scores, n, &o[0][0]);
    }
#endif
    if (!vec) pv_scalar(V, row, start, len, bs, hd, nh, scores, n, &o[0][0]);
    for (int g = 0; g < nh; ++g) {
        float inv = 1.0f / sum[g];
        for (int i = 0; i < hd; ++i) out[(size_t)g * hd + i] = ST(o[g][i] * inv);
    }
}

/* Head `head` of row m (query heads 0..NH-1, then key heads): (q/k norm), rotary; a key head also
 * writes its K and V at the row's slot. */
static void rope_head(const Dims *d, const int64_t *P, st_t *qkv, int m, int head, const st_t *cos_t,
                      const st_t *sin_t, const int64_t *pos, const int64_t *slots, st_t *kv) {
    st_t *vec = qkv + (size_t)m * d->QKVN + (size_t)head * d->HD;
    if (d->qk_norm) {
        const st_t *w = (const st_t *)P[head < d->NH ? L_Q_NORM : L_K_NORM];
        st_t normed[1024];
        rms_norm(vec, w, d->HD, d->eps, normed);
        memcpy(vec, normed, sizeof(st_t) * d->HD);
    }
    rotary(vec, cos_t + (size_t)pos[m] * d->ROT, sin_t + (size_t)pos[m] * d->ROT, d->ROT);
    if (head >= d->NH) {
        int kvh = head - d->NH;
        const st_t *v = qkv + (size_t)m * d->QKVN + (size_t)(d->NH + d->KV + kvh) * d->HD;
        memcpy(kv + ((size_t)kvh * d->slots + slots[m]) * d->HD, vec, sizeof(st_t) * d->HD);
        memcpy(kv + ((size_t)(d->KV + kvh) * d->slots + slots[m]) * d->HD, v, sizeof(st_t) * d->HD);
    }
}

/* Query head `head` of row m attended into attn; with qs, the head's blocks of the o projection's
 * input rounded to int8 there too (quant_x_block). */
static void attend_head(const Dims *d, const st_t *qkv, const st_t *kv, const int64_t *table, int max_blocks, int m,
                        const int64_t *pos, int head, float *scores, st_t *attn, const QScratch *qs) {
    attend(d, qkv + (size_t)m * d->QKVN, kv, table, max_blocks, m, (int)pos[m], head, 1, scores,
           attn + (size_t)m * d->NH * d->HD + (size_t)head * d->HD);
    if (qs)
        for (int b = head * d->HD / 32; b < (head + 1) * d->HD / 32; ++b)
            quant_x_block(qs, attn, d->NH * d->HD, m, b, 1);
}

static void add_into(st_t *x, const st_t *y, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = ST(LD(x[i]) + LD(y[i]));
}

/* h = RMSNorm(x) row by row (w: its weight); q (not NULL): h's blocks rounded to int8 there too */
static void norm_rows(const st_t *x, const st_t *w, const Dims *d, st_t *h, const QScratch *q) {
    for (int m = 0; m < d->M; ++m) rms_norm(x + (size_t)m * d->H, w, d->H, d->eps, h + (size_t)m * d->H);
    if (q) quant_x_rows(q, h, d->M, d->H);
}

/* aux[i] = x (n elements) for every i with aux_layers[i] == l (a layer may be named twice) */
static void capture_aux(const int64_t *aux_layers, int n_aux, int l, const st_t *x, size_t n, st_t *aux) {
    for (int i = 0; i < n_aux; ++i)
        if (aux_layers[i] == l) memcpy(aux + (size_t)i * n, x, sizeof(st_t) * n);
}

#endif
