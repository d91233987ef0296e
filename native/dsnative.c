/* dsagent.format._native: the digest's, the unpack's and the pack's per-file loops in C, without the GIL.
 *
 * Optional: built by the package's build (setup.py: `pip install .`, `make native` in a
 * checkout) when a C compiler is there; when it is absent, dsagent.format.native says so
 * and the pure-Python loops run. Both give the
 * same sizes, mtimes and digests (tests/dsagent/format/test_native.py holds them equal).
 *
 * hash_tree (hashtree.c) is the digest: it opens each file of the walk's groups relative
 * to its directory, fstat's it, reads it into a page-aligned buffer (a file smaller than
 * the buffer with one read of its size + 1 bytes) and hashes it with xxh3-128, on a thread
 * a core started inside the call, all with the GIL released. Digests are 16 bytes per
 * file (xxh3-128's canonical big-endian form, what hexdigest() spells).
 *
 * The one-pass pack's serial steps are here too: list_dirs (listdir.c), plan_cuts (plan.c)
 * and entry_lines and digest_records (manifestlines.c), each giving exactly what its Python
 * rule gives; the manifest reader's entry_columns (manifestlines.c: the plain lines, values
 * as json reads them, anything else left to it); and, in its pipeline, the samples its
 * blocks are judged by, the zero runs of the tar framing and the raw frames that store them
 * as RLE blocks (probe.c), each byte for byte what dsagent.format.bundles.frames makes in
 * Python.
 *
 * xxh3 is compiled in from the vendored xxHash (native/vendor/xxhash/: the release the
 * xxhash Python package of the lock is built from, so both paths hash with the same code).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* XXH3, compiled in from the vendored single-header xxHash (native/vendor/xxhash/, its
 * README says which release). On x86 xxHash's own dispatcher picks SSE2, AVX2 or AVX-512 at
 * run time, as the xxhash package does; it defines XXH_INLINE_ALL and includes xxhash.h
 * itself. Elsewhere the header alone, for the build's baseline. Either way every function is
 * private to this module (-fvisibility=hidden): nothing is looked up or exported. */
#if defined(__x86_64__) || defined(__i386__)
#include "xxh_x86dispatch.c"
#define xxh3_128_oneshot XXH3_128bits_dispatch
#define xxh3_update XXH3_128bits_update_dispatch
#define xxh3_64_oneshot XXH3_64bits_dispatch
#else
#define XXH_INLINE_ALL
#include "xxhash.h"
#define xxh3_128_oneshot XXH3_128bits
#define xxh3_update XXH3_128bits_update
#define xxh3_64_oneshot XXH3_64bits
#endif
#define xxh3_create XXH3_createState
#define xxh3_free XXH3_freeState
#define xxh3_reset XXH3_128bits_reset
#define xxh3_digest XXH3_128bits_digest
typedef XXH128_hash_t xxh128_hash;
typedef XXH3_state_t xxh3_state;

static void canonical(xxh128_hash h, unsigned char *out) {
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(h.high64 >> (56 - 8 * i));
        out[8 + i] = (unsigned char)(h.low64 >> (56 - 8 * i));
    }
}

/* A stat time in nanoseconds, as os.stat_result's st_*_ns give it. */
/* value as exactly `digits` octal digits, zero-padded, at out (no NUL): what "%0*llo" prints
 * for a value below 8^digits (the tar headers' fields), without printf's cost per field (a
 * small file's header is three of them). */
static void octal_into(unsigned char *out, unsigned long long value, int digits) {
    for (int k = digits - 1; k >= 0; k--) {
        out[k] = (unsigned char)('0' + (value & 7));
        value >>= 3;
    }
}

static long long ns_of(struct timespec t) {
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static ssize_t read_full(int fd, unsigned char *buf, size_t want) {
    ssize_t n;
    do {
        n = read(fd, buf, want);
    } while (n < 0 && errno == EINTR);
    return n;
}

typedef struct {
    long long size;
    long long mtime_ns;
    unsigned char digest[16];
} result_row;

/* One file, for hash_tree: 0, or an errno (>0), or -1 when its size changed (row->size is
 * what was read). */
static int hash_one(int dir_fd, const char *name, unsigned char *buf, size_t cap, xxh3_state *state,
                    result_row *row, long long *expected) {
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return e;
    }
    *expected = (long long)st.st_size;
    row->mtime_ns = ns_of(st.st_mtim);
    size_t first = (size_t)st.st_size < cap ? (size_t)st.st_size + 1 : cap;
    ssize_t n = read_full(fd, buf, first);
    if (n < 0) {
        int e = errno;
        close(fd);
        return e;
    }
    long long total = n;
    if ((size_t)st.st_size < cap && n == st.st_size) {
        canonical(xxh3_128_oneshot(buf, (size_t)n), row->digest);
    } else { /* big, or not the stat'ed size any more: stream to the end */
        xxh3_reset(state);
        xxh3_update(state, buf, (size_t)n);
        while (n > 0) {
            n = read_full(fd, buf, cap);
            if (n < 0) {
                int e = errno;
                close(fd);
                return e;
            }
            xxh3_update(state, buf, (size_t)n);
            total += n;
        }
        canonical(xxh3_digest(state), row->digest);
    }
    close(fd);
    row->size = total;
    return total == *expected ? 0 : -1;
}

/* A str path as os.fsencode spells it, kept alive for the caller: an ASCII str's own
 * characters, else its encoding, appended to `holder`; *length its bytes; NULL with an
 * error set. A NUL inside is the caller's to refuse (it is opened as a C string). */
static const char *fs_path(PyObject *str, PyObject *holder, Py_ssize_t *length) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(str) < 0) return NULL;
#endif
    if (PyUnicode_IS_ASCII(str)) {
        *length = PyUnicode_GET_LENGTH(str);
        return (const char *)PyUnicode_DATA(str);
    }
    PyObject *encoded = PyUnicode_EncodeFSDefault(str);
    if (encoded == NULL || PyList_Append(holder, encoded) != 0) {
        Py_XDECREF(encoded);
        return NULL;
    }
    Py_DECREF(encoded); /* the holder keeps it */
    *length = PyBytes_GET_SIZE(encoded);
    return PyBytes_AS_STRING(encoded);
}

/* A new object of `type` with the 512-byte header template `tmpl` copied in at `offset`
 * (released either way); NULL with an error set when it is not one block. */
static PyObject *new_with_template(PyTypeObject *type, Py_buffer *tmpl, size_t offset) {
    PyObject *obj = NULL;
    if (tmpl->len != 512)
        PyErr_SetString(PyExc_ValueError, "the template is one 512-byte header");
    else if ((obj = type->tp_alloc(type, 0)) != NULL)
        memcpy((char *)obj + offset, tmpl->buf, 512);
    PyBuffer_Release(tmpl);
    return obj;
}

/* The I/O hook (None but in fault injection, tools/support/faults.py): a callable the
 * unpack loop calls, with the GIL, before each create ("open", dir_fd, name) and each write
 * ("write", fd, None) of a file; an OSError it raises is that call's failure (its errno),
 * and it may end the process there (kill -9). A feed takes its own reference to the hook
 * when it starts. */
static PyObject *io_hook = NULL;

static PyObject *set_io_hook(PyObject *self, PyObject *hook) {
    (void)self;
    if (hook != Py_None && !PyCallable_Check(hook)) {
        PyErr_SetString(PyExc_TypeError, "the I/O hook is a callable or None");
        return NULL;
    }
    Py_XSETREF(io_hook, hook == Py_None ? NULL : Py_NewRef(hook));
    Py_RETURN_NONE;
}

/* 0, or the errno the hook's OSError carries (EIO for any other exception); with the GIL
 * taken for the call, from a loop that released it. */
static int hook_says(PyObject *hook, const char *kind, int fd, const char *name) {
    if (hook == NULL) return 0;
    int failure = 0;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *result = name != NULL ? PyObject_CallFunction(hook, "siy", kind, fd, name)
                                    : PyObject_CallFunction(hook, "siO", kind, fd, Py_None);
    if (result == NULL) {
        failure = EIO;
        if (PyErr_ExceptionMatches(PyExc_OSError)) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            PyObject *code = value != NULL ? PyObject_GetAttrString(value, "errno") : NULL;
            if (code != NULL && PyLong_Check(code) && PyLong_AsLong(code) > 0) failure = (int)PyLong_AsLong(code);
            Py_XDECREF(code);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
        }
        PyErr_Clear();
    } else {
        Py_DECREF(result);
    }
    PyGILState_Release(gil);
    return failure;
}

/* mallopt(option, value) -> bool: glibc's mallopt, False where the C library has none;
 * syncfs(fd) -> 0 or the errno: the filesystem holding fd written back (ENOSYS off Linux).
 * Two system calls dsplatform.heap and dsagent.format.durable make at every dsctl pack and
 * unpack, here so that those commands do not load ctypes for them (2.7 ms of a start). */
static PyObject *call_mallopt(PyObject *self, PyObject *args) {
    (void)self;
    int option, value;
    if (!PyArg_ParseTuple(args, "ii:mallopt", &option, &value)) return NULL;
#if defined(__GLIBC__)
    return PyBool_FromLong(mallopt(option, value) == 1);
#else
    (void)option;
    (void)value;
    Py_RETURN_FALSE;
#endif
}

static PyObject *call_syncfs(PyObject *self, PyObject *arg) {
    (void)self;
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0) return NULL;
#if defined(__linux__)
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = syncfs(fd) != 0;
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(failed ? errno : 0);
#else
    return PyLong_FromLong(ENOSYS);
#endif
}

#include "pool.c"       /* worker threads and their own descriptor tables: the pack reader, hash_tree */
#include "unpackloop.c" /* the unpack's member loop: Unpacker */
#include "packloop.c" /* the pack's reader loop: TarReader */
#include "listdir.c" /* the pack's listing: list_dirs */
#include "probe.c"   /* the pack's frame helpers: block_samples, zero_tails, rle_frame */
#include "manifestlines.c" /* the manifest's lines and digest records: entry_lines, digest_records, entry_columns */
#include "plan.c" /* the bundle plan's boundaries: plan_cuts */
#include "layout.c" /* the layout checks: first_unsafe, parents */
#include "sizecheck.c" /* the ready check's lstat loop: sized_files */
#include "hashtree.c" /* the digest of many files on a thread a core: hash_tree */

static PyMethodDef methods[] = {
    {"hash_tree", hash_tree, METH_VARARGS,
     "hash_tree(groups, cap, threads, isolate) -> (sizes, mtimes_ns, digests, failure): see native/hashtree.c."},
    {"entry_lines", entry_lines, METH_VARARGS, "entry_lines(paths, sizes, mtimes, digests) -> bytes | None: see native/manifestlines.c."},
    {"digest_records", digest_records, METH_VARARGS, "digest_records(paths, sizes, digests) -> bytes | None: see native/manifestlines.c."},
    {"entry_columns", entry_columns, METH_O, "entry_columns(lines) -> (paths, sizes, mtimes, digests) | None: see native/manifestlines.c."},
    {"plan_cuts", plan_cuts, METH_VARARGS, "plan_cuts(paths, upto, max_files, max_bytes) -> list | None: see native/plan.c."},
    {"block_samples", block_samples, METH_VARARGS,
     "block_samples(buffer, block, pieces, piece) -> bytes: see native/probe.c."},
    {"zero_tails", zero_tails, METH_VARARGS, "zero_tails(buffer, block, least) -> bytes: see native/probe.c."},
    {"rle_frame", rle_frame, METH_VARARGS, "rle_frame(buffer, least) -> bytes: see native/probe.c."},
    {"first_unsafe", first_unsafe, METH_O, "first_unsafe(paths) -> int: see native/layout.c."},
    {"parents", parents, METH_O, "parents(paths) -> set[str]: see native/layout.c."},
    {"mallopt", call_mallopt, METH_VARARGS, "mallopt(option, value) -> bool: glibc's mallopt (False without one)."},
    {"syncfs", call_syncfs, METH_O, "syncfs(fd) -> 0 or the errno: the filesystem holding fd written back."},
    {"set_io_hook", set_io_hook, METH_O, "set_io_hook(callable or None): fault injection's hook, see dsnative.c."},
    {"sized_files", sized_files, METH_VARARGS,
     "sized_files(root, paths, sizes, start, stop) -> [index, ...]: see native/sizecheck.c."},
    {"list_dirs", list_dirs, METH_VARARGS,
     "list_dirs(paths, prefixes, stat=True, threads=1) -> [(paths, stats, dirs, others, entries, device, inode)]: see native/listdir.c."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The digest's, the unpack's and the pack's per-file loops in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&UnpackerType) < 0 || PyType_Ready(&TarReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* what dsagent.format.native checks before it uses the module: raised with every change
     * of a function's arguments or results, or a function added or removed */
    if (PyModule_AddIntConstant(m, "INTERFACE", 22) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObject(m, "Unpacker", Py_NewRef((PyObject *)&UnpackerType)) < 0) {
        Py_DECREF(&UnpackerType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObject(m, "TarReader", Py_NewRef((PyObject *)&TarReaderType)) < 0) {
        Py_DECREF(&TarReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
