/* The pack's reader loop: a bundle's tar stream laid out from the source files, without the GIL.
 *
 * Included by dsnative.c (one translation unit: it uses its xxh3 binding and helpers).
 *
 * TarReader(dir_fd, members, template, header, threads=1) takes one bundle's members in order: a
 * sequence of tuples (path: str, size: int, mtime_ns: int, digest: str), dsagent's
 * FileEntry, copied into a list of its own and read field by field here (no column is
 * built in Python: at 50,000 members that cost the pack 24 ms before its first byte).
 * Each path is opened relative to dir_fd, symlinks
 * followed as the walk followed them (an ASCII path straight from the str, any other
 * encoded as os.fsencode does); a digest is '' for an entry not digested yet, else 32 hex
 * digits. template: the 512 bytes plain headers are made from (name, size, mtime and
 * checksum blank). A member whose header is not plain (a path that is not ASCII or is
 * longer than 100 bytes, a size or an mtime that does not fit 11 octal digits) gets
 * header(member): the bytes of its headers (the pax headers Python's tarfile writes),
 * asked once, here.
 *
 * fill(buffer) -> (written, status, a, b) writes the tar stream on into the writable
 * buffer with the GIL released, for as many members as fit, carrying a header, a file or
 * its padding over to the next call: each plain header is built from the template (the
 * name, 11 octal digits of size and of mtime in seconds, the checksum), each file is read
 * straight into the buffer and hashed with xxh3-128 while it is read. The end-of-archive
 * blocks are the caller's. status:
 *   0 MORE: the buffer is full (written == len(buffer));
 *   1 DONE: every member is written (written <= len(buffer));
 *   2 ERRNO: opening or reading entry `a` failed with errno `b`;
 *   3 CHANGED: entry `a`, not digested yet, is not the size it was listed with (b: the
 *     bytes read, or -1 when it was longer), or its size or mtime changed while it was read;
 *   4 DIGEST: entry `a`, digested before, now reads another size or digest.
 * After 2-4 the object is spent. `next` is the index of the next member not finished, and
 * `digests` the 16-byte digests of the members finished so far.
 *
 * threads (default 1): with more than one, the members that fit whole in the buffer (two or
 * more, at a member boundary) are read on that many threads (this one among them, the
 * others a work_pool of pool.c, each on a table of file descriptors of its own holding only
 * dir_fd), each straight to its place in the stream, hashed and checked as the loop does,
 * and their headers and padding laid out around them afterwards. The first failure in the
 * members' order is the one answered. Members that do not fit go through the loop as
 * before. The threads live until close() or the object's end.
 */

typedef struct {
    PyObject_HEAD
    int dir_fd;
    Py_ssize_t count;
    PyObject *members; /* the list of entries: an ASCII path's bytes are its str's */
    PyObject *special; /* list: the special headers and non-ASCII paths' bytes, kept alive */
    const unsigned char **spec_ptr; /* entry -> its special header, NULL: plain */
    size_t *spec_len;
    const char **name_ptr;
    Py_ssize_t *name_len;
    unsigned long long *sizes;
    long long *mtimes;
    unsigned char *expected; /* 16 bytes an entry; all zero: not digested yet */
    unsigned char *found;    /* 16 bytes an entry: what was read */
    unsigned char tmpl[512];
    Py_ssize_t next;
    int phase; /* 0 header, 1 data, 2 padding */
    unsigned char hbuf[512];
    const unsigned char *hptr; /* the header being copied: hbuf, or a special header's bytes */
    size_t hlen, hoff;
    int fd;
    unsigned long long done; /* data bytes of the current member read */
    int proven;              /* the current member's end was seen (a read returned less than asked) */
    size_t pad;              /* padding bytes left */
    xxh3_state *state;
    int spent;
    int busy;
    int threads;                /* members read on this many threads (1: by the loop) */
    struct read_job *jobs;      /* the members queued (READS_MAX), allocated at the first */
    work_pool *pool;            /* the reading threads, started at the first queue */
    unsigned char *out;         /* the buffer being filled, while the queue is read */
} TarReader;

enum { TR_MORE = 0, TR_DONE = 1, TR_ERRNO = 2, TR_CHANGED = 3, TR_DIGEST = 4 };
enum { TP_HEADER = 0, TP_DATA = 1, TP_PAD = 2 };

static int is_zero16(const unsigned char *p) {
    for (int i = 0; i < 16; i++)
        if (p[i]) return 0;
    return 1;
}

/* The plain header of entry i into r->hbuf (the Python writer's fast path, byte for byte). */
static void plain_header(TarReader *r, Py_ssize_t i) {
    unsigned char *h = r->hbuf;
    memcpy(h, r->tmpl, 512);
    memset(h, 0, 100);
    memcpy(h, r->name_ptr[i], (size_t)r->name_len[i]);
    /* a plain member's size and mtime fit 11 octal digits (else its header is special) */
    octal_into(h + 124, r->sizes[i], 11);
    h[135] = 0;
    octal_into(h + 136, (unsigned long long)(r->mtimes[i] / 1000000000LL), 11);
    h[147] = 0;
    memset(h + 148, ' ', 8);
    unsigned long sum = 0;
    for (int k = 0; k < 512; k++) sum += h[k];
    octal_into(h + 148, sum, 6); /* at most 512 x 255: 6 octal digits */
    h[154] = 0;
    h[155] = ' ';
}

/* What the loop answers for member i that read longer than it was listed. */
static int longer_than_listed(const TarReader *r, Py_ssize_t i) {
    return is_zero16(r->expected + 16 * i) ? TR_CHANGED : TR_DIGEST;
}

/* Member i read to its end (`done` bytes; its digest in r->found; `fd` still open),
 * checked as the Python loop checks it: 0, TR_DIGEST (digested before: now another size
 * or digest), TR_CHANGED (not digested yet: not the size it was listed with, or its size or
 * mtime changed while it was read; *b the bytes read) or TR_ERRNO (*b the fstat's errno). */
static int member_checked(const TarReader *r, Py_ssize_t i, int fd, unsigned long long done, long long *b) {
    if (!is_zero16(r->expected + 16 * i))
        return done != r->sizes[i] || memcmp(r->found + 16 * i, r->expected + 16 * i, 16) != 0 ? TR_DIGEST : 0;
    struct stat st;
    if (done == r->sizes[i] && fstat(fd, &st) != 0) {
        *b = errno;
        return TR_ERRNO;
    }
    if (done != r->sizes[i] || (unsigned long long)st.st_size != r->sizes[i] || ns_of(st.st_mtim) != r->mtimes[i]) {
        *b = (long long)done;
        return TR_CHANGED;
    }
    return 0;
}

/* Finish the current member: its digest and checks; 0, or a status. */
static int finish_file(TarReader *r, long long *a, long long *b) {
    Py_ssize_t i = r->next;
    canonical(xxh3_digest(r->state), r->found + 16 * i);
    int status = member_checked(r, i, r->fd, r->done, b);
    close(r->fd);
    r->fd = -1;
    if (status) *a = i;
    return status;
}

#define READS_MAX 4096 /* members queued at most per buffer */

typedef struct read_job {
    Py_ssize_t index;
    size_t hoff, doff; /* where its header and its data go in the buffer */
    int status;        /* 0 or what the loop would answer (TR_ERRNO, TR_CHANGED, TR_DIGEST) */
    long long b;
} read_job;

/* One queued member read as the loop reads it: one read of its size + 1 bytes (a short
 * answer proves its end; the byte over lands where its padding or the next header goes,
 * both laid out afterwards), hashed, and checked as the loop checks it (member_checked). */
static void read_queued(void *ctx, Py_ssize_t item) {
    TarReader *r = ctx;
    read_job *j = &r->jobs[item];
    Py_ssize_t i = j->index;
    unsigned long long size = r->sizes[i];
    j->status = 0;
    j->b = 0;
    int fd = openat(r->dir_fd, r->name_ptr[i], O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        j->status = TR_ERRNO, j->b = errno;
        return;
    }
    ssize_t got = read_full(fd, r->out + j->doff, (size_t)size + 1);
    if (got < 0) {
        j->status = TR_ERRNO, j->b = errno;
    } else if ((unsigned long long)got > size) {
        j->status = longer_than_listed(r, i), j->b = -1;
    } else {
        canonical(xxh3_128_oneshot(r->out + j->doff, (size_t)got), r->found + 16 * i);
        j->status = member_checked(r, i, fd, (unsigned long long)got, &j->b);
    }
    close(fd);
}

/* At a member boundary: the members that fit whole in out[*pos:room] (one byte to spare)
 * read on the threads, then laid out in order. -1: fewer than two fit (the loop takes the
 * next one); 0: read, *pos past them; else the first failure in order (a, b). */
static int tr_queued(TarReader *r, unsigned char *out, size_t room, size_t *pos, long long *a, long long *b) {
    if (r->jobs == NULL && (r->jobs = malloc(READS_MAX * sizeof(read_job))) == NULL) return -1;
    Py_ssize_t first = r->next, n = 0;
    size_t at = *pos;
    while (first + n < r->count && n < READS_MAX) {
        Py_ssize_t i = first + n;
        size_t head = r->spec_ptr[i] != NULL ? r->spec_len[i] : 512;
        unsigned long long size = r->sizes[i], pad = (512 - size % 512) % 512;
        if ((unsigned long long)(room - at) < head + size + pad + 1) break;
        r->jobs[n].index = i;
        r->jobs[n].hoff = at;
        r->jobs[n].doff = at + head;
        at += head + (size_t)(size + pad);
        n++;
    }
    if (n < 2) return -1;
    if (r->pool == NULL) r->pool = pool_start(r->threads, r->dir_fd);
    r->out = out;
    pool_run(r->pool, read_queued, r, n);
    r->out = NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        read_job *j = &r->jobs[k];
        Py_ssize_t i = j->index;
        if (j->status != 0) {
            r->next = i;
            *pos = j->hoff;
            *a = i;
            *b = j->b;
            return j->status;
        }
        if (r->spec_ptr[i] != NULL) {
            memcpy(out + j->hoff, r->spec_ptr[i], r->spec_len[i]);
        } else {
            plain_header(r, i);
            memcpy(out + j->hoff, r->hbuf, 512);
        }
        memset(out + j->doff + r->sizes[i], 0, (512 - r->sizes[i] % 512) % 512);
    }
    r->next = first + n;
    *pos = at;
    return 0;
}

static int tr_run(TarReader *r, unsigned char *out, size_t room, size_t *used, long long *a, long long *b) {
    size_t pos = 0;
    for (;;) {
        if (r->threads > 1 && r->phase == TP_HEADER && r->hlen == 0 && r->next < r->count) {
            int st = tr_queued(r, out, room, &pos, a, b);
            if (st > 0) {
                *used = pos;
                return st;
            }
            if (st == 0 && (r->next >= r->count || pos == room)) {
                *used = pos;
                return r->next >= r->count ? TR_DONE : TR_MORE;
            }
            if (st == 0) continue; /* the next member may fit once the loop has begun it */
        }
        if (r->phase == TP_HEADER) {
            if (r->hlen == 0) { /* the next member's header */
                if (r->next >= r->count) {
                    *used = pos;
                    return TR_DONE;
                }
                if (r->spec_ptr[r->next] != NULL) {
                    r->hptr = r->spec_ptr[r->next];
                    r->hlen = r->spec_len[r->next];
                } else {
                    plain_header(r, r->next);
                    r->hptr = r->hbuf;
                    r->hlen = 512;
                }
                r->hoff = 0;
            }
            size_t n = r->hlen - r->hoff;
            if (n > room - pos) n = room - pos;
            memcpy(out + pos, r->hptr + r->hoff, n);
            pos += n;
            r->hoff += n;
            if (r->hoff < r->hlen) {
                *used = pos;
                return TR_MORE;
            }
            r->hoff = r->hlen = 0;
            r->fd = openat(r->dir_fd, r->name_ptr[r->next], O_RDONLY | O_CLOEXEC | O_NOCTTY);
            if (r->fd < 0) {
                *a = r->next;
                *b = errno;
                *used = pos;
                return TR_ERRNO;
            }
            xxh3_reset(r->state);
            r->done = 0;
            r->proven = 0;
            r->phase = TP_DATA;
        }
        if (r->phase == TP_DATA) {
            unsigned long long size = r->sizes[r->next];
            while (!r->proven) {
                unsigned long long left = size > r->done ? size - r->done : 0;
                size_t space = room - pos;
                ssize_t got;
                if (left < space) { /* one byte more than it should hold: a short answer proves the end */
                    size_t asked = (size_t)left + 1;
                    got = read_full(r->fd, out + pos, asked);
                    if (got >= 0 && (size_t)got < asked) r->proven = 1;
                } else if (space > 0) {
                    got = read_full(r->fd, out + pos, space);
                    if (got == 0) r->proven = 1;
                } else {
                    *used = pos;
                    return TR_MORE;
                }
                if (got < 0) {
                    *a = r->next;
                    *b = errno;
                    close(r->fd);
                    r->fd = -1;
                    *used = pos;
                    return TR_ERRNO;
                }
                if (r->done + (unsigned long long)got > size) { /* longer than listed */
                    *a = r->next;
                    *b = -1;
                    r->done += (unsigned long long)got;
                    close(r->fd);
                    r->fd = -1;
                    *used = pos;
                    return longer_than_listed(r, r->next);
                }
                xxh3_update(r->state, out + pos, (size_t)got);
                pos += (size_t)got;
                r->done += (unsigned long long)got;
            }
            int status = finish_file(r, a, b);
            if (status) {
                *used = pos;
                return status;
            }
            r->pad = (size_t)((512 - size % 512) % 512);
            r->phase = TP_PAD;
        }
        if (r->phase == TP_PAD) {
            size_t n = r->pad < room - pos ? r->pad : room - pos;
            memset(out + pos, 0, n);
            pos += n;
            r->pad -= n;
            if (r->pad) {
                *used = pos;
                return TR_MORE;
            }
            r->next++;
            r->phase = TP_HEADER;
            if (pos == room) {
                *used = pos;
                return r->next >= r->count ? TR_DONE : TR_MORE;
            }
        }
    }
}

static PyObject *TarReader_fill(TarReader *r, PyObject *arg) {
    if (r->spent) {
        PyErr_SetString(PyExc_RuntimeError, "the reader stopped on an error");
        return NULL;
    }
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "fill is running in another thread");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_WRITABLE) != 0) return NULL;
    size_t used = 0;
    long long a = 0, b = 0;
    int status;
    r->busy = 1;
    Py_BEGIN_ALLOW_THREADS status = tr_run(r, view.buf, (size_t)view.len, &used, &a, &b);
    Py_END_ALLOW_THREADS
    r->busy = 0;
    PyBuffer_Release(&view);
    if (status >= TR_ERRNO) r->spent = 1;
    return Py_BuildValue("(niLL)", (Py_ssize_t)used, status, a, b);
}

static PyObject *TarReader_get_next(TarReader *r, void *c) {
    (void)c;
    return PyLong_FromSsize_t(r->next);
}

static PyObject *TarReader_get_digests(TarReader *r, void *c) {
    (void)c;
    return PyBytes_FromStringAndSize((const char *)r->found, 16 * r->next);
}

static PyObject *TarReader_close(TarReader *r, PyObject *unused) {
    (void)unused;
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "fill is running in another thread");
        return NULL;
    }
    pool_release(&r->pool);
    Py_RETURN_NONE;
}

static void TarReader_dealloc(TarReader *r) {
    pool_stop(r->pool); /* idle threads: they end at once */
    free(r->jobs);
    if (r->fd >= 0) close(r->fd);
    if (r->state) xxh3_free(r->state);
    PyMem_Free(r->name_ptr);
    PyMem_Free(r->name_len);
    PyMem_Free(r->spec_ptr);
    PyMem_Free(r->spec_len);
    PyMem_Free(r->sizes);
    PyMem_Free(r->mtimes);
    PyMem_Free(r->expected);
    PyMem_Free(r->found);
    Py_XDECREF(r->members);
    Py_XDECREF(r->special);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* Bytes of 11 octal digits hold numbers below this (tarfile's limit for a plain header). */
#define USTAR_LIMIT (1ULL << 33)

static int hex_digit(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Member i's fields into r (its header asked of `header` when it is not plain); -1 with an
 * error set. */
static int tr_member(TarReader *r, Py_ssize_t i, PyObject *member, PyObject *header) {
    if (!PyTuple_Check(member) || PyTuple_GET_SIZE(member) < 4) {
        PyErr_SetString(PyExc_TypeError, "a member is a (path, size, mtime_ns, digest) tuple");
        return -1;
    }
    PyObject *path = PyTuple_GET_ITEM(member, 0), *digest = PyTuple_GET_ITEM(member, 3);
    if (!PyUnicode_Check(path) || !PyUnicode_Check(digest)) {
        PyErr_SetString(PyExc_TypeError, "a member's path and digest are str");
        return -1;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(digest) < 0) return -1;
#endif
    if ((r->name_ptr[i] = fs_path(path, r->special, &r->name_len[i])) == NULL) return -1;
    int ascii = PyUnicode_IS_ASCII(path);
    if ((size_t)r->name_len[i] != strlen(r->name_ptr[i])) {
        PyErr_SetString(PyExc_ValueError, "a member's path holds a NUL");
        return -1;
    }
    r->sizes[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(member, 1));
    if (r->sizes[i] == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    r->mtimes[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(member, 2));
    if (r->mtimes[i] == -1 && PyErr_Occurred()) return -1;
    Py_ssize_t hex = PyUnicode_GET_LENGTH(digest);
    if (hex == 32 && PyUnicode_IS_ASCII(digest)) {
        const unsigned char *text = PyUnicode_DATA(digest);
        for (int k = 0; k < 16; k++) {
            int hi = hex_digit(text[2 * k]), lo = hex_digit(text[2 * k + 1]);
            if (hi < 0 || lo < 0) goto bad_digest;
            r->expected[16 * i + k] = (unsigned char)(hi << 4 | lo);
        }
    } else if (hex != 0) {
        goto bad_digest;
    }
    int plain = ascii && r->name_len[i] <= 100 && r->sizes[i] < USTAR_LIMIT && r->mtimes[i] >= 0 &&
                (unsigned long long)(r->mtimes[i] / 1000000000LL) < USTAR_LIMIT;
    if (plain) return 0;
    PyObject *bytes = PyObject_CallOneArg(header, member);
    if (bytes == NULL) return -1;
    if (!PyBytes_Check(bytes) || PyBytes_GET_SIZE(bytes) == 0 || PyBytes_GET_SIZE(bytes) % 512 != 0) {
        Py_DECREF(bytes);
        PyErr_SetString(PyExc_ValueError, "a special header is whole 512-byte blocks of bytes");
        return -1;
    }
    int failed = PyList_Append(r->special, bytes);
    Py_DECREF(bytes);
    if (failed) return -1;
    r->spec_ptr[i] = (const unsigned char *)PyBytes_AS_STRING(bytes);
    r->spec_len[i] = (size_t)PyBytes_GET_SIZE(bytes);
    return 0;
bad_digest:
    PyErr_SetString(PyExc_ValueError, "a member's digest is '' or 32 lowercase hex digits");
    return -1;
}

static PyObject *TarReader_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *keywords[] = {"dir_fd", "members", "template", "header", "threads", NULL};
    int dir_fd, threads = 1;
    PyObject *members, *header;
    Py_buffer tmpl;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOy*O|i", keywords, &dir_fd, &members, &tmpl, &header, &threads))
        return NULL;
    if (!PyCallable_Check(header) || threads < 1) {
        PyBuffer_Release(&tmpl);
        PyErr_SetString(threads < 1 ? PyExc_ValueError : PyExc_TypeError,
                        threads < 1 ? "threads is at least 1" : "header is a callable");
        return NULL;
    }
    TarReader *r = (TarReader *)new_with_template(type, &tmpl, offsetof(TarReader, tmpl));
    if (r == NULL) return NULL;
    r->fd = -1;
    r->dir_fd = dir_fd;
    r->threads = threads;
    r->members = PySequence_List(members); /* a list of our own: nothing can drop a path in use */
    if (r->members == NULL) goto fail;
    r->count = PyList_GET_SIZE(r->members);
    Py_ssize_t c = r->count ? r->count : 1;
    r->name_ptr = PyMem_Calloc(c, sizeof(char *));
    r->name_len = PyMem_Calloc(c, sizeof(Py_ssize_t));
    r->spec_ptr = PyMem_Calloc(c, sizeof(unsigned char *));
    r->spec_len = PyMem_Calloc(c, sizeof(size_t));
    r->sizes = PyMem_Calloc(c, sizeof(unsigned long long));
    r->mtimes = PyMem_Calloc(c, sizeof(long long));
    r->expected = PyMem_Calloc(c, 16);
    r->found = PyMem_Calloc(c, 16);
    r->special = PyList_New(0);
    if (r->name_ptr == NULL || r->name_len == NULL || r->spec_ptr == NULL || r->spec_len == NULL ||
        r->sizes == NULL || r->mtimes == NULL || r->expected == NULL || r->found == NULL || r->special == NULL)
        goto nomem;
    for (Py_ssize_t i = 0; i < r->count; i++)
        if (tr_member(r, i, PyList_GET_ITEM(r->members, i), header) != 0) goto fail;
    if ((r->state = xxh3_create()) == NULL) goto nomem;
    return (PyObject *)r;
nomem:
    PyErr_NoMemory();
fail:
    Py_DECREF(r);
    return NULL;
}

static PyMethodDef TarReader_methods[] = {
    {"fill", (PyCFunction)TarReader_fill, METH_O, "fill(buffer) -> (written, status, a, b): see the module source."},
    {"close", (PyCFunction)TarReader_close, METH_NOARGS, "close(): the reading threads ended (they end with the object too)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef TarReader_getset[] = {
    {"next", (getter)TarReader_get_next, NULL, "the index of the next member not finished", NULL},
    {"digests", (getter)TarReader_get_digests, NULL, "16-byte digests of the members finished", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TarReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsagent.format._native.TarReader",
    .tp_basicsize = sizeof(TarReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One bundle's tar stream read from its source files: see native/packloop.c.",
    .tp_new = TarReader_new,
    .tp_dealloc = (destructor)TarReader_dealloc,
    .tp_methods = TarReader_methods,
    .tp_getset = TarReader_getset,
};
