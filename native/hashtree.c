/* The digest of many files on a thread a core, all in one call: hash_tree.
 *
 * hash_tree(groups, cap, threads, isolate) hashes the files of `groups`, a list of
 * (rel, directory, names) tuples (the walk's groups, dsagent.format.walk.Dir; rel is not
 * read) with hash_one (dsnative.c), on up to `threads` threads started and joined inside
 * the call (this one among them), with the GIL released from the first file to the last.
 * Each thread takes the next 32 files not taken, opens their directory once for a run of
 * them, and reads each file into a page-aligned buffer of its own of `cap` bytes.
 *
 * With `isolate`, each started thread first gives itself a private table of file
 * descriptors holding only the standard streams (own_fd_table, pool.c, which says why); the calling thread always keeps the
 * process's table. The threads are started per call: a digest is one call per 8,192 files.
 *
 * It returns (sizes, mtimes_ns, digests, None): sizes and mtimes as native int64s, 8 bytes
 * a file, digests 16 bytes a file, every file in the order of the groups. When a file
 * failed: empty columns and (index, errno, expected, got) for the failure with the lowest
 * index over all the groups' files: errno != 0 when an open, stat or read failed (expected
 * == -1: the file's directory did not open), else the file's size changed from expected
 * to got while it was read. Every name and directory is encoded as os.fsencode does
 * before the GIL is released, into memory the call owns: the caller may change its lists
 * meanwhile.
 */

#define TREE_CHUNK 32
#define TREE_THREADS_MAX 64

typedef struct {
    const char **dirs;      /* one a group */
    Py_ssize_t *starts;     /* a group's first file; starts[groups] == count */
    Py_ssize_t groups;
    const char **names;     /* one a file */
    Py_ssize_t count;
    result_row *rows;
    size_t cap;
    int isolate;
    _Atomic Py_ssize_t next; /* the first file not taken */
    _Atomic Py_ssize_t stop_at; /* the lowest failed index (count when none) */
    pthread_mutex_t lock;   /* guards the failure's details */
    Py_ssize_t fail_index;
    int fail_errno;
    long long fail_expected, fail_got;
    int out_of_memory;
} tree_job;

static void tree_failed(tree_job *job, Py_ssize_t index, int err, long long expected, long long got) {
    pthread_mutex_lock(&job->lock);
    if (index < job->fail_index) {
        job->fail_index = index;
        job->fail_errno = err;
        job->fail_expected = expected;
        job->fail_got = got;
        atomic_store(&job->stop_at, index);
    }
    pthread_mutex_unlock(&job->lock);
}

/* The group holding file `index` (starts is sorted; a binary search). */
static Py_ssize_t group_of(const tree_job *job, Py_ssize_t index) {
    Py_ssize_t lo = 0, hi = job->groups - 1;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo + 1) / 2;
        if (job->starts[mid] <= index) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static void tree_work(tree_job *job) {
    unsigned char *buf = NULL;
    xxh3_state *state = xxh3_create();
    if (state == NULL || posix_memalign((void **)&buf, 4096, job->cap) != 0) {
        pthread_mutex_lock(&job->lock);
        job->out_of_memory = 1;
        pthread_mutex_unlock(&job->lock);
        atomic_store(&job->stop_at, 0);
        if (state) xxh3_free(state);
        return;
    }
    Py_ssize_t open_group = -1;
    int dfd = -1;
    for (;;) {
        Py_ssize_t start = atomic_fetch_add(&job->next, TREE_CHUNK);
        if (start >= job->count || start >= atomic_load(&job->stop_at)) break;
        Py_ssize_t end = start + TREE_CHUNK < job->count ? start + TREE_CHUNK : job->count;
        Py_ssize_t g = group_of(job, start);
        for (Py_ssize_t i = start; i < end; i++) {
            while (i >= job->starts[g + 1]) g++;
            if (g != open_group) {
                if (dfd >= 0) close(dfd);
                open_group = g;
                dfd = open(job->dirs[g], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (dfd < 0) {
                    tree_failed(job, i, errno, -1, -1);
                    break;
                }
            }
            long long expected = 0;
            int failure = hash_one(dfd, job->names[i], buf, job->cap, state, &job->rows[i], &expected);
            if (failure != 0) {
                tree_failed(job, i, failure > 0 ? failure : 0, expected, job->rows[i].size);
                break;
            }
        }
        if (dfd < 0) open_group = -1; /* a directory that failed is tried again by nobody: stop_at */
    }
    if (dfd >= 0) close(dfd);
    free(buf);
    xxh3_free(state);
}

static void *tree_thread(void *arg) {
    tree_job *job = arg;
    name_thread("dsnative-hash"); /* pool.c */
    if (job->isolate) own_fd_table(-1); /* pool.c; refused: the shared table */
    tree_work(job);
    return NULL;
}

/* An encoded name the call keeps alive: a str as fs_path (dsnative.c) spells it (an ASCII
 * one read in place, held by the call's own tuple), anything else encoded as os.fsencode
 * does into `holder`. */
static const char *encoded_name(PyObject *name, PyObject *holder) {
    if (PyUnicode_Check(name)) {
        Py_ssize_t length;
        const char *text = fs_path(name, holder, &length);
        if (text != NULL && (Py_ssize_t)strlen(text) != length) {
            PyErr_SetString(PyExc_ValueError, "embedded null byte");
            return NULL;
        }
        return text;
    }
    PyObject *raw = NULL;
    if (!PyUnicode_FSConverter(name, &raw)) return NULL;
    int added = PyList_Append(holder, raw);
    Py_DECREF(raw); /* the holder keeps it */
    return added == 0 ? PyBytes_AS_STRING(raw) : NULL;
}

static PyObject *hash_tree(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *given;
    Py_ssize_t cap;
    int threads, isolate;
    if (!PyArg_ParseTuple(args, "O!nip", &PyList_Type, &given, &cap, &threads, &isolate)) return NULL;
    if (cap < 4096) {
        PyErr_SetString(PyExc_ValueError, "the buffer must hold at least 4096 bytes");
        return NULL;
    }
    PyObject *groups = PySequence_Tuple(given); /* the call's own: the caller's list may change */
    PyObject *holder = PyList_New(0);           /* every tuple and encoded name the call made */
    tree_job job = {0};
    PyObject *result = NULL;
    if (groups == NULL || holder == NULL) goto done;
    Py_ssize_t ngroups = PyTuple_GET_SIZE(groups), count = 0;
    job.dirs = PyMem_Calloc(ngroups + 1, sizeof(char *));
    job.starts = PyMem_Calloc(ngroups + 1, sizeof(Py_ssize_t));
    if (job.dirs == NULL || job.starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject **lists = PyMem_Calloc(ngroups + 1, sizeof(PyObject *));
    if (lists == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        PyObject *pair = PyTuple_GET_ITEM(groups, g), *directory, *names;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 3) {
            PyErr_SetString(PyExc_TypeError, "each group is a (rel, directory, names) tuple");
            PyMem_Free(lists);
            goto done;
        }
        directory = PyTuple_GET_ITEM(pair, 1);
        names = PySequence_Tuple(PyTuple_GET_ITEM(pair, 2));
        if (names == NULL || PyList_Append(holder, names) != 0) {
            Py_XDECREF(names);
            PyMem_Free(lists);
            goto done;
        }
        Py_DECREF(names); /* the holder keeps it */
        PyObject *raw = NULL;
        if (!PyUnicode_FSConverter(directory, &raw) || PyList_Append(holder, raw) != 0) {
            Py_XDECREF(raw);
            PyMem_Free(lists);
            goto done;
        }
        Py_DECREF(raw);
        job.dirs[g] = PyBytes_AS_STRING(raw);
        job.starts[g] = count;
        lists[g] = names;
        count += PyTuple_GET_SIZE(names);
    }
    job.starts[ngroups] = count;
    job.names = PyMem_Calloc(count ? count : 1, sizeof(char *));
    job.rows = PyMem_Calloc(count ? count : 1, sizeof(result_row));
    if (job.names == NULL || job.rows == NULL) {
        PyErr_NoMemory();
        PyMem_Free(lists);
        goto done;
    }
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(lists[g]); k++) {
            const char *name = encoded_name(PyTuple_GET_ITEM(lists[g], k), holder);
            if (name == NULL) {
                PyMem_Free(lists);
                goto done;
            }
            job.names[job.starts[g] + k] = name;
        }
    }
    PyMem_Free(lists);
    job.groups = ngroups;
    job.count = count;
    job.cap = (size_t)cap;
    job.isolate = isolate;
    atomic_init(&job.next, 0);
    atomic_init(&job.stop_at, count);
    job.fail_index = count;
    pthread_mutex_init(&job.lock, NULL);
    if (threads > TREE_THREADS_MAX) threads = TREE_THREADS_MAX;
    Py_ssize_t chunks = (count + TREE_CHUNK - 1) / TREE_CHUNK;
    if ((Py_ssize_t)threads > chunks) threads = (int)chunks;
    if (count > 0) {
        pthread_t ids[TREE_THREADS_MAX];
        int started = 0;
        Py_BEGIN_ALLOW_THREADS
        for (; started < threads - 1; started++)
            if (pthread_create(&ids[started], NULL, tree_thread, &job) != 0) break; /* fewer, then */
        tree_work(&job);
        for (int k = 0; k < started; k++) pthread_join(ids[k], NULL);
        Py_END_ALLOW_THREADS
    }
    pthread_mutex_destroy(&job.lock);
    if (job.out_of_memory) {
        PyErr_NoMemory();
        goto done;
    }
    if (job.fail_index < count) {
        result = Py_BuildValue("(yyy(niLL))", "", "", "", job.fail_index, job.fail_errno, job.fail_expected,
                               job.fail_got);
        goto done;
    }
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, 8 * count);
    PyObject *mtimes = PyBytes_FromStringAndSize(NULL, 8 * count);
    PyObject *digests = PyBytes_FromStringAndSize(NULL, 16 * count);
    if (sizes == NULL || mtimes == NULL || digests == NULL) {
        Py_XDECREF(sizes);
        Py_XDECREF(mtimes);
        Py_XDECREF(digests);
        goto done;
    }
    int64_t *size_out = (int64_t *)PyBytes_AS_STRING(sizes), *mtime_out = (int64_t *)PyBytes_AS_STRING(mtimes);
    char *digest_out = PyBytes_AS_STRING(digests);
    for (Py_ssize_t i = 0; i < count; i++) {
        size_out[i] = (int64_t)job.rows[i].size;
        mtime_out[i] = (int64_t)job.rows[i].mtime_ns;
        memcpy(digest_out + 16 * i, job.rows[i].digest, 16);
    }
    result = Py_BuildValue("(NNNO)", sizes, mtimes, digests, Py_None);
done:
    PyMem_Free(job.rows);
    PyMem_Free(job.names);
    PyMem_Free(job.starts);
    PyMem_Free(job.dirs);
    Py_XDECREF(holder);
    Py_XDECREF(groups);
    return result;
}
