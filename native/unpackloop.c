/* The unpack's member loop (included by dsnative.c: one translation unit, it uses its xxh3
 * binding and helpers).
 *
 * Unpacker(dir_fd, names, sizes, mtimes, digests, template, by_name=False, writers=1) takes
 * one bundle's manifest entries in order (names: a sequence of bytes, the member names,
 * copied into a tuple the object owns; sizes: array('Q') bytes; mtimes: array('q') bytes;
 * digests: 16 raw bytes an entry) and the plain header bundles are written with (template:
 * 512 bytes, name, size, mtime and checksum blank).
 *
 * feed(buffer) -> (consumed, status, a, b) runs over the decompressed tar bytes with the GIL
 * released. It takes only what it can check completely: a plain header (every fixed field
 * as the template, 11 octal digits for the size and the mtime, an ASCII name, the checksum
 * right) naming exactly the next entry. Each such member is created in dir_fd under its
 * index, or with by_name at its name (its directories made beforehand by the caller), with
 * O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, written, hashed with xxh3-128 while it is
 * written and dated with the manifest's mtime. status:
 *   0 all of buffer consumed (a member or a header may continue in the next buffer);
 *   1 FOREIGN: the next header is anything else (a pax or GNU header, another type, another
 *     name, a bad checksum): `a` is that header's 512 bytes, the stream resumes with them,
 *     then buffer[consumed:]; the caller parses that member itself (and its rules decide);
 *   2 END: an all-zero block was consumed (buffer[consumed:] is what follows it);
 *   3 SIZE: the next entry's header says `b` bytes, the manifest another size (entry `a`);
 *   4 DIGEST: entry `a` was written but does not match its digest;
 *   5 ERRNO: creating or writing entry `a` failed with errno `b` (`failed_op` says which
 *     call: 1 the create, 2 a write, 3 setting its mtime, 4 closing it).
 * After 3-5 the object is spent. Every argument may be given by keyword; an unknown keyword
 * is a TypeError.
 *
 * writers > 1: the members whose header, data and padding are all in the buffer are taken
 * a batch at a time and written by that many threads (a pool of the object's own, pool.c:
 * the calling thread and writers - 1 workers, each with its own descriptor table, kept until
 * close() or the object's end); a member cut by the buffer's end is written by the calling thread, as
 * with writers = 1. A batch is written before anything after it (a member of the calling
 * thread, the end, a foreign header, a size refused), and its failures are reported as the
 * first in index order would be alone: files after a failed one in its batch may exist
 * (the caller removes what a failed bundle wrote). A tree of small files is mostly the
 * kernel's creates, one after another on one thread.
 *
 * `next` is the index of the next entry, `written` the bytes of the entries done, `phase` 0
 * between members, 1 inside a header, 2 inside member data, 3 inside the padding after it
 * (what a stream ending here lacks).
 */

enum { PH_HEADER = 0, PH_DATA = 2, PH_PAD = 3 };
enum { ST_MORE = 0, ST_FOREIGN = 1, ST_END = 2, ST_SIZE = 3, ST_DIGEST = 4, ST_ERRNO = 5 };
enum { OP_NONE = 0, OP_OPEN = 1, OP_WRITE = 2, OP_UTIME = 3, OP_CLOSE = 4 };

typedef struct {
    PyObject_HEAD
    int dir_fd;
    Py_ssize_t count;
    PyObject *names; /* tuple of bytes, this object's own: name_ptr points into it */
    const char **name_ptr;
    Py_ssize_t *name_len;
    unsigned long long *sizes;
    long long *mtimes;
    unsigned char *digests;
    unsigned char tmpl[512];
    Py_ssize_t next;
    long long written;
    int phase;
    unsigned char hbuf[512];
    size_t hlen;
    int fd;
    unsigned long long left; /* data bytes left of the current member */
    size_t pad;              /* padding bytes left */
    xxh3_state *state;
    int spent;
    int by_name; /* create each file at its name (directories made beforehand), not at its index */
    int busy;    /* a feed is running (without the GIL): a second caller is refused */
    int failed_op; /* after ST_ERRNO: which call failed (OP_*) */
    PyObject *hook; /* the I/O hook of the running feed (a reference of its own), or NULL */
    int writers;             /* threads writing the members whole in a buffer (1: the caller alone) */
    struct work_pool *pool;  /* their pool, started at the first batch */
    struct member_job *jobs; /* the batch (BATCH_MAX) */
} Unpacker;

/* A member whole in the buffer, written by the pool. */
typedef struct member_job {
    Py_ssize_t index;
    const unsigned char *data;
    unsigned long long size;
    int status; /* 0, ST_DIGEST or ST_ERRNO */
    int err;
    int op;
} member_job;

#define BATCH_MAX 1024

static int octal11(const unsigned char *f, unsigned long long *out) {
    unsigned long long v = 0;
    for (int i = 0; i < 11; i++) {
        if (f[i] < '0' || f[i] > '7') return -1;
        v = v * 8 + (unsigned long long)(f[i] - '0');
    }
    if (f[11] != 0) return -1;
    *out = v;
    return 0;
}

/* 1 when block is a plain header naming entry u->next, with its size in *size. */
static int plain_next(Unpacker *u, const unsigned char *b, unsigned long long *size) {
    if (memcmp(b + 100, u->tmpl + 100, 24) != 0 || memcmp(b + 156, u->tmpl + 156, 512 - 156) != 0) return 0;
    unsigned long long mtime;
    if (octal11(b + 124, size) != 0 || octal11(b + 136, &mtime) != 0) return 0;
    unsigned long sum = 8 * ' ';
    for (int i = 0; i < 148; i++) sum += b[i];
    for (int i = 156; i < 512; i++) sum += b[i];
    unsigned char want[6];
    octal_into(want, sum, 6); /* at most 512 x 255: 6 octal digits */
    if (memcmp(b + 148, want, 6) != 0 || b[154] != 0 || b[155] != ' ') return 0;
    size_t n = 100;
    while (n > 0 && b[n - 1] == 0) n--;
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (b[i] == 0 || b[i] >= 0x80) return 0;
    if (u->next >= u->count) return 0;
    if ((size_t)u->name_len[u->next] != n || memcmp(u->name_ptr[u->next], b, n) != 0) return 0;
    return 1;
}

static int write_all(int fd, const unsigned char *p, size_t n, PyObject *hook) {
    while (n > 0) {
        int e = hook_says(hook, "write", fd, NULL);
        if (e != 0) return e;
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Date a written member's file with its mtime and close it: 0, or the errno and *op. */
static int date_and_close(int fd, long long mtime, int *op) {
    struct timespec ts[2];
    ts[0].tv_sec = ts[1].tv_sec = (time_t)(mtime / 1000000000LL);
    ts[0].tv_nsec = ts[1].tv_nsec = (long)(mtime % 1000000000LL);
    if (ts[0].tv_nsec < 0) {
        ts[0].tv_nsec += 1000000000L;
        ts[1].tv_nsec = ts[0].tv_nsec;
        ts[0].tv_sec -= 1;
        ts[1].tv_sec = ts[0].tv_sec;
    }
    if (futimens(fd, ts) != 0) {
        int e = errno;
        *op = OP_UTIME;
        close(fd);
        return e;
    }
    if (close(fd) != 0 && errno != EINTR) {
        *op = OP_CLOSE;
        return errno;
    }
    return 0;
}

/* Create entry `index`'s file (at its index, or by_name at its name): the descriptor, or -1
 * with errno set (the hook's errno too). */
static int create_member(Unpacker *u, Py_ssize_t index) {
    char fname[32];
    snprintf(fname, sizeof fname, "%zd", index);
    const char *target = u->by_name ? u->name_ptr[index] : fname;
    int fd, e = hook_says(u->hook, "open", u->dir_fd, target);
    if (e != 0) {
        errno = e;
        return -1;
    }
    do {
        fd = openat(u->dir_fd, target, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

/* Ends the current member once its padding is read too (the Python loop reads the padding
 * before it compares the digest, so a stream cut in the padding is refused as cut by both):
 * digest, mtime, close. 0 or a status (a = index, b = errno). */
static int finish_member(Unpacker *u, long long *a, long long *b) {
    unsigned char got[16];
    canonical(xxh3_digest(u->state), got);
    Py_ssize_t i = u->next;
    int fd = u->fd;
    u->fd = -1;
    if (memcmp(got, u->digests + 16 * i, 16) != 0) {
        close(fd);
        *a = i;
        return ST_DIGEST;
    }
    int op = OP_NONE, e = date_and_close(fd, u->mtimes[i], &op);
    if (e != 0) {
        *a = i;
        *b = e;
        u->failed_op = op;
        return ST_ERRNO;
    }
    u->written += (long long)u->sizes[i];
    u->next = i + 1;
    u->phase = PH_HEADER;
    return 0;
}

/* One member of a batch, on a thread of the pool: created, written, checked, dated, closed. */
static void write_job(void *ctx, Py_ssize_t item) {
    Unpacker *u = ctx;
    member_job *j = &u->jobs[item];
    int fd = create_member(u, j->index);
    if (fd < 0) {
        j->status = ST_ERRNO;
        j->err = errno;
        j->op = OP_OPEN;
        return;
    }
    int e = write_all(fd, j->data, (size_t)j->size, u->hook);
    if (e != 0) {
        close(fd);
        j->status = ST_ERRNO;
        j->err = e;
        j->op = OP_WRITE;
        return;
    }
    unsigned char got[16];
    canonical(xxh3_128_oneshot(j->data, (size_t)j->size), got);
    if (memcmp(got, u->digests + 16 * j->index, 16) != 0) {
        close(fd);
        j->status = ST_DIGEST;
        return;
    }
    e = date_and_close(fd, u->mtimes[j->index], &j->op);
    if (e != 0) {
        j->status = ST_ERRNO;
        j->err = e;
    }
}

/* Write the batch of `*count` members on the pool; 0, or the first failure in index order
 * as finish_member reports it (next goes back to that entry). */
static int flush_batch(Unpacker *u, Py_ssize_t *count, long long *a, long long *b) {
    Py_ssize_t n = *count;
    if (n == 0) return 0;
    *count = 0;
    if (u->pool == NULL) u->pool = pool_start(u->writers, u->dir_fd); /* NULL: this thread alone */
    pool_run(u->pool, write_job, u, n);
    for (Py_ssize_t k = 0; k < n; k++) {
        member_job *j = &u->jobs[k];
        if (j->status != 0) {
            u->next = j->index;
            *a = j->index;
            if (j->status == ST_ERRNO) {
                *b = j->err;
                u->failed_op = j->op;
            }
            return j->status;
        }
        u->written += (long long)j->size;
    }
    return 0;
}

static int run(Unpacker *u, const unsigned char *p, size_t n, size_t *used, long long *a, long long *b) {
    size_t pos = 0;
    int st = ST_MORE;
    Py_ssize_t batched = 0; /* members taken for the pool, not yet written */
    while (pos < n) {
        if (u->phase == PH_PAD) {
            size_t take = u->pad < n - pos ? u->pad : n - pos;
            pos += take;
            u->pad -= take;
            if (u->pad == 0 && (st = finish_member(u, a, b)) != 0) break;
            continue;
        }
        if (u->phase == PH_DATA) {
            size_t take = u->left < (unsigned long long)(n - pos) ? (size_t)u->left : n - pos;
            xxh3_update(u->state, p + pos, take);
            int e = write_all(u->fd, p + pos, take, u->hook);
            if (e != 0) {
                *a = u->next;
                *b = e;
                u->failed_op = OP_WRITE;
                st = ST_ERRNO;
                break;
            }
            pos += take;
            u->left -= take;
            if (u->left == 0) {
                if (u->pad > 0)
                    u->phase = PH_PAD;
                else if ((st = finish_member(u, a, b)) != 0)
                    break;
            }
            continue;
        }
        /* a header, whole in this buffer or gathered across buffers */
        const unsigned char *h;
        if (u->hlen == 0 && n - pos >= 512) {
            h = p + pos;
            pos += 512;
        } else {
            size_t take = 512 - u->hlen < n - pos ? 512 - u->hlen : n - pos;
            memcpy(u->hbuf + u->hlen, p + pos, take);
            u->hlen += take;
            pos += take;
            if (u->hlen < 512) break;
            h = u->hbuf;
        }
        u->hlen = 0;
        int zero = 1;
        for (int i = 0; i < 512; i++)
            if (h[i] != 0) {
                zero = 0;
                break;
            }
        if (zero) {
            st = ST_END;
            break;
        }
        unsigned long long size;
        if (!plain_next(u, h, &size)) {
            if (h != u->hbuf) memcpy(u->hbuf, h, 512);
            st = ST_FOREIGN;
            break;
        }
        if (size != u->sizes[u->next]) {
            *a = u->next;
            *b = (long long)size;
            st = ST_SIZE;
            break;
        }
        size_t pad = (size_t)((512 - size % 512) % 512);
        if (u->jobs != NULL && h != u->hbuf && size <= (unsigned long long)(n - pos) && pad <= n - pos - size) {
            member_job *j = &u->jobs[batched++];
            j->index = u->next;
            j->data = p + pos;
            j->size = size;
            j->status = j->err = j->op = 0;
            pos += (size_t)size + pad;
            u->next++;
            if (batched == BATCH_MAX && (st = flush_batch(u, &batched, a, b)) != 0) break;
            continue;
        }
        if ((st = flush_batch(u, &batched, a, b)) != 0) break; /* the members before this one first */
        int fd = create_member(u, u->next);
        if (fd < 0) {
            *a = u->next;
            *b = errno;
            u->failed_op = OP_OPEN;
            st = ST_ERRNO;
            break;
        }
        u->fd = fd;
        u->left = size;
        u->pad = pad;
        xxh3_reset(u->state);
        u->phase = PH_DATA;
        if (size == 0 && (st = finish_member(u, a, b)) != 0) break;
    }
    if (batched > 0) { /* written before what ended the run is reported, a failure of theirs first */
        long long ba = 0, bb = 0;
        int failed = flush_batch(u, &batched, &ba, &bb);
        if (failed != 0) {
            st = failed;
            *a = ba;
            *b = bb;
        }
    }
    *used = pos;
    return st;
}

static PyObject *Unpacker_feed(Unpacker *u, PyObject *arg) {
    if (u->spent || u->busy) {
        PyErr_SetString(PyExc_ValueError, u->spent ? "this unpacker stopped at a failure" : "feed is already running");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    u->busy = 1;
    u->hook = Py_XNewRef(io_hook); /* this feed's own, whatever set_io_hook does meanwhile */
    size_t used = 0;
    long long a = 0, b = 0;
    int st;
    Py_BEGIN_ALLOW_THREADS st = run(u, (const unsigned char *)view.buf, (size_t)view.len, &used, &a, &b);
    Py_END_ALLOW_THREADS u->busy = 0;
    Py_CLEAR(u->hook);
    PyBuffer_Release(&view);
    if (st == ST_FOREIGN) return Py_BuildValue("(niy#i)", (Py_ssize_t)used, st, (const char *)u->hbuf, (Py_ssize_t)512, 0);
    if (st >= ST_SIZE) {
        u->spent = 1;
        if (u->fd >= 0) {
            close(u->fd);
            u->fd = -1;
        }
    }
    return Py_BuildValue("(niLL)", (Py_ssize_t)used, st, a, b);
}

static PyObject *Unpacker_close(Unpacker *u, PyObject *unused) {
    (void)unused;
    if (u->busy) {
        PyErr_SetString(PyExc_RuntimeError, "feed is running in another thread");
        return NULL;
    }
    pool_release(&u->pool);
    Py_RETURN_NONE;
}

static PyObject *Unpacker_skip_to(Unpacker *u, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (u->busy || i < u->next || i > u->count || u->phase != PH_HEADER || u->hlen != 0) {
        PyErr_SetString(PyExc_ValueError, "skip_to: not between members, or backwards");
        return NULL;
    }
    u->next = i;
    Py_RETURN_NONE;
}

static PyObject *Unpacker_get_next(Unpacker *u, void *c) {
    (void)c;
    return PyLong_FromSsize_t(u->next);
}
static PyObject *Unpacker_get_written(Unpacker *u, void *c) {
    (void)c;
    return PyLong_FromLongLong(u->written);
}
static PyObject *Unpacker_get_failed_op(Unpacker *u, void *c) {
    (void)c;
    return PyLong_FromLong(u->failed_op);
}
static PyObject *Unpacker_get_phase(Unpacker *u, void *c) {
    (void)c;
    return PyLong_FromLong(u->phase == PH_HEADER && u->hlen > 0 ? 1 : u->phase);
}

static void Unpacker_dealloc(Unpacker *u) {
    pool_stop(u->pool);
    PyMem_Free(u->jobs);
    if (u->fd >= 0) close(u->fd);
    if (u->state) xxh3_free(u->state);
    PyMem_Free(u->name_ptr);
    PyMem_Free(u->name_len);
    PyMem_Free(u->sizes);
    PyMem_Free(u->mtimes);
    PyMem_Free(u->digests);
    Py_XDECREF(u->names);
    Py_TYPE(u)->tp_free((PyObject *)u);
}

static int copy_column(PyObject *obj, Py_ssize_t count, size_t item, void **out) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) != 0) return -1;
    if ((size_t)v.len != (size_t)count * item) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "a column does not have one item per name");
        return -1;
    }
    *out = PyMem_Malloc(v.len ? (size_t)v.len : 1);
    if (*out == NULL) {
        PyBuffer_Release(&v);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*out, v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return 0;
}

/* Pointers to and lengths of a tuple of bytes names (kept alive by the tuple, which nothing
 * else can change); with no_nul, a name holding a NUL byte is refused (it is opened as a C
 * string). -1 with an error set. */
static int name_columns(PyObject *names, const char **ptr, Py_ssize_t *len, int no_nul) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *item = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(item) || (no_nul && (size_t)PyBytes_GET_SIZE(item) != strlen(PyBytes_AS_STRING(item)))) {
            PyErr_SetString(PyExc_TypeError, no_nul ? "names are bytes without NUL" : "names are bytes");
            return -1;
        }
        ptr[i] = PyBytes_AS_STRING(item);
        len[i] = PyBytes_GET_SIZE(item);
    }
    return 0;
}

static PyObject *Unpacker_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *keywords[] = {"dir_fd", "names", "sizes", "mtimes", "digests", "template", "by_name", "writers",
                               NULL};
    int dir_fd;
    PyObject *names, *sizes, *mtimes, *digests;
    Py_buffer tmpl;
    int by_name = 0, writers = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOOOOy*|pi", keywords, &dir_fd, &names, &sizes, &mtimes, &digests,
                                     &tmpl, &by_name, &writers))
        return NULL;
    if (writers < 1 || writers > POOL_THREADS_MAX) {
        PyBuffer_Release(&tmpl);
        PyErr_Format(PyExc_ValueError, "writers must be 1 to %d", POOL_THREADS_MAX);
        return NULL;
    }
    /* a tuple of our own: a caller changing its list cannot free a name in use */
    PyObject *owned = PySequence_Tuple(names);
    if (owned == NULL) {
        PyBuffer_Release(&tmpl);
        return NULL;
    }
    Unpacker *u = (Unpacker *)new_with_template(type, &tmpl, offsetof(Unpacker, tmpl));
    if (u == NULL) {
        Py_DECREF(owned);
        return NULL;
    }
    u->fd = -1;
    u->dir_fd = dir_fd;
    u->by_name = by_name;
    u->count = PyTuple_GET_SIZE(owned);
    u->names = owned;
    Py_ssize_t c = u->count ? u->count : 1;
    u->name_ptr = PyMem_Calloc(c, sizeof(char *));
    u->name_len = PyMem_Calloc(c, sizeof(Py_ssize_t));
    if (u->name_ptr == NULL || u->name_len == NULL) goto nomem;
    if (name_columns(u->names, u->name_ptr, u->name_len, 0) != 0) goto fail;
    if (copy_column(sizes, u->count, 8, (void **)&u->sizes) != 0) goto fail;
    if (copy_column(mtimes, u->count, 8, (void **)&u->mtimes) != 0) goto fail;
    if (copy_column(digests, u->count, 16, (void **)&u->digests) != 0) goto fail;
    if ((u->state = xxh3_create()) == NULL) goto nomem;
    u->writers = writers;
    if (writers > 1 && (u->jobs = PyMem_Calloc(BATCH_MAX, sizeof(member_job))) == NULL) goto nomem;
    return (PyObject *)u;
nomem:
    PyErr_NoMemory();
fail:
    Py_DECREF(u);
    return NULL;
}

static PyMethodDef Unpacker_methods[] = {
    {"feed", (PyCFunction)Unpacker_feed, METH_O, "feed(buffer) -> (consumed, status, a, b): see native/unpackloop.c."},
    {"skip_to", (PyCFunction)Unpacker_skip_to, METH_O, "skip_to(index): the caller wrote the entries before index."},
    {"close", (PyCFunction)Unpacker_close, METH_NOARGS,
     "close(): the writing threads ended (they end with the object too; a later feed starts them again)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Unpacker_getset[] = {
    {"next", (getter)Unpacker_get_next, NULL, "the index of the next entry", NULL},
    {"written", (getter)Unpacker_get_written, NULL, "bytes of the entries written", NULL},
    {"phase", (getter)Unpacker_get_phase, NULL, "0 between members, 1 header, 2 data, 3 padding", NULL},
    {"failed_op", (getter)Unpacker_get_failed_op, NULL, "after an errno status: 1 create, 2 write, 3 mtime, 4 close", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject UnpackerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsagent.format._native.Unpacker",
    .tp_basicsize = sizeof(Unpacker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One bundle's member loop: see native/unpackloop.c.",
    .tp_new = Unpacker_new,
    .tp_dealloc = (destructor)Unpacker_dealloc,
    .tp_methods = Unpacker_methods,
    .tp_getset = Unpacker_getset,
};
