/* The pack's frame helpers (included by dsnative.c): the samples it judges its blocks by,
 * the zero runs of the tar framing, and raw frames with those runs as RLE blocks.
 *
 * block_samples(buffer, block, pieces, piece) -> bytes
 *
 * For each block of `block` bytes of `buffer` (the last one shorter), its sample, one after
 * the other: `pieces` pieces of `piece` bytes spread evenly over the block (the first at
 * its start, the last at its end, `(length - piece) // (pieces - 1)` bytes apart), or the
 * whole block when it is no longer than pieces * piece bytes. Byte for byte the samples
 * dsagent.format.bundles.frames cuts in Python, for a whole buffer in one call: there, 64 slices
 * and a join a block cost more than zstd's verdict on the sample.
 */

static PyObject *block_samples(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    Py_ssize_t block, pieces, piece;
    if (!PyArg_ParseTuple(args, "y*nnn", &data, &block, &pieces, &piece)) return NULL;
    PyObject *out = NULL;
    if (block <= 0 || pieces < 2 || piece <= 0 || pieces > block / piece) {
        PyErr_SetString(PyExc_ValueError, "a positive block of two pieces or more");
        goto done;
    }
    Py_ssize_t most = pieces * piece, blocks = (data.len + block - 1) / block;
    Py_ssize_t last = data.len - (blocks - 1) * block, total = 0;
    if (blocks > 0) total = (blocks - 1) * most + (last < most ? last : most);
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    unsigned char *to = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *bytes = data.buf;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const unsigned char *at = bytes + b * block;
        Py_ssize_t length = b == blocks - 1 ? last : block;
        if (length <= most) {
            memcpy(to, at, (size_t)length);
            to += length;
            continue;
        }
        Py_ssize_t step = (length - piece) / (pieces - 1);
        for (Py_ssize_t i = 0; i < pieces; i++, to += piece) memcpy(to, at + i * step, (size_t)piece);
    }
done:
    PyBuffer_Release(&data);
    return out;
}

/* Zero runs: runs of zero bytes that end where a 512-byte tar record ends (a header's
 * unused tail, a member's padding, the end of the archive), records counted from the
 * buffer's start, merged where they touch, kept when at least `least` bytes long. The
 * rule of dsagent.format.bundles.frames.zero_runs, which these follow byte for byte. */

#define RECORD 512

typedef struct {
    Py_ssize_t start, end;
} zero_run;

/* Where the zero bytes that end the record ending at `end` start (at[end - 1] is zero): read
 * eight bytes at a time, as the tails are a few hundred bytes, one or two a member. */
static Py_ssize_t zero_tail_start(const unsigned char *at, Py_ssize_t end) {
    Py_ssize_t start = end - 1, floor = end - RECORD;
    uint64_t word;
    while (start - 8 >= floor) {
        memcpy(&word, at + start - 8, 8);
        if (word != 0) break;
        start -= 8;
    }
    while (start > floor && at[start - 1] == 0) start--;
    return start;
}

/* Calls `take(run, context)` for each zero run of `at[0:length]` in order; -1 when take fails. */
static int each_zero_run(const unsigned char *at, Py_ssize_t length, Py_ssize_t least,
                         int (*take)(zero_run, void *), void *context) {
    zero_run run = {0, 0};
    int open = 0;
    for (Py_ssize_t end = RECORD; end <= length; end += RECORD) {
        if (at[end - 1] != 0) continue;
        Py_ssize_t start = zero_tail_start(at, end);
        if (open && run.end == start && start == end - RECORD) {
            run.end = end; /* a whole record of zeros goes on from the run before it */
            continue;
        }
        if (open && run.end - run.start >= least && take(run, context) != 0) return -1;
        run.start = start;
        run.end = end;
        open = 1;
    }
    if (open && run.end - run.start >= least && take(run, context) != 0) return -1;
    return 0;
}

typedef struct {
    long long *totals;
    Py_ssize_t block;
} tail_context;

static int add_tail(zero_run run, void *context) {
    tail_context *c = context;
    for (Py_ssize_t at = run.start; at < run.end;) { /* a run over a block's end counts in both */
        Py_ssize_t b = at / c->block, stop = (b + 1) * c->block < run.end ? (b + 1) * c->block : run.end;
        c->totals[b] += stop - at;
        at = stop;
    }
    return 0;
}

/* zero_tails(buffer, block, least) -> bytes: one native int64 a block of `block` bytes, the
 * bytes of its zero runs. */
static PyObject *zero_tails(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    Py_ssize_t block, least;
    if (!PyArg_ParseTuple(args, "y*nn", &data, &block, &least)) return NULL;
    PyObject *out = NULL;
    if (block <= 0 || block % RECORD != 0 || least <= 0) {
        PyErr_SetString(PyExc_ValueError, "a block of whole 512-byte records and a positive least run");
        goto done;
    }
    Py_ssize_t blocks = (data.len + block - 1) / block;
    out = PyBytes_FromStringAndSize(NULL, blocks * (Py_ssize_t)sizeof(long long));
    if (out == NULL) goto done;
    tail_context c = {(long long *)PyBytes_AS_STRING(out), block};
    memset(c.totals, 0, (size_t)blocks * sizeof(long long));
    Py_BEGIN_ALLOW_THREADS
    each_zero_run(data.buf, data.len, least, add_tail, &c);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&data);
    return out;
}

typedef struct {
    unsigned char *to, *last; /* where the next block goes; the last block's header */
    const unsigned char *from;
    Py_ssize_t done; /* bytes of the input framed so far */
} frame_context;

static void block_header(frame_context *c, Py_ssize_t size, int type) {
    unsigned long value = (unsigned long)size << 3 | (unsigned long)type << 1;
    c->last = c->to;
    c->to[0] = value & 0xff;
    c->to[1] = value >> 8 & 0xff;
    c->to[2] = value >> 16 & 0xff;
    c->to += 3;
}

/* Raw blocks up to the run, then the run as RLE blocks (an empty run: raw blocks only). */
static int frame_to(zero_run run, void *context) {
    frame_context *c = context;
    while (c->done < run.start) {
        Py_ssize_t n = run.start - c->done < 128 * 1024 ? run.start - c->done : 128 * 1024;
        block_header(c, n, 0);
        memcpy(c->to, c->from + c->done, (size_t)n);
        c->to += n;
        c->done += n;
    }
    while (c->done < run.end) {
        Py_ssize_t n = run.end - c->done < 128 * 1024 ? run.end - c->done : 128 * 1024;
        block_header(c, n, 1);
        *c->to++ = 0;
        c->done += n;
    }
    return 0;
}

/* rle_frame(buffer, least) -> bytes: the buffer as one zstd frame (the raw frame header of
 * dsagent.format.bundles.frames), its zero runs as RLE blocks and the rest as raw blocks, each at
 * most 128 KiB, the last one marked last. */
static PyObject *rle_frame(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    Py_ssize_t least;
    if (!PyArg_ParseTuple(args, "y*n", &data, &least)) return NULL;
    PyObject *out = NULL;
    if (least <= 0) {
        PyErr_SetString(PyExc_ValueError, "a positive least run");
        goto done;
    }
    /* at most: the header, the data, and 4 bytes a block (a block a 128 KiB, a run or a
     * record) */
    Py_ssize_t bound = 6 + data.len + 4 * (data.len / 64 + 2);
    out = PyBytes_FromStringAndSize(NULL, bound);
    if (out == NULL) goto done;
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(out);
    static const unsigned char header[6] = {0x28, 0xB5, 0x2F, 0xFD, 0x00, 7 << 3};
    memcpy(start, header, 6);
    frame_context c = {start + 6, NULL, data.buf, 0};
    zero_run rest = {data.len, data.len};
    Py_BEGIN_ALLOW_THREADS
    each_zero_run(data.buf, data.len, least, frame_to, &c);
    frame_to(rest, &c);
    Py_END_ALLOW_THREADS
    if (c.last == NULL) block_header(&c, 0, 0); /* empty: one empty raw block */
    c.last[0] |= 1;                             /* Last_Block */
    if (_PyBytes_Resize(&out, (Py_ssize_t)(c.to - start)) != 0) out = NULL;
done:
    PyBuffer_Release(&data);
    return out;
}
