/* The manifest's entry lines, and the entries' digest records (included by dsnative.c).
 *
 * entry_lines(paths, sizes, mtimes, digests) -> bytes | None
 *
 * Each entry as one line, byte for byte what dsagent.format.manifest._entry_line writes
 * and encodes (json.dumps([path, size, mtime, hexdigest], ensure_ascii=False,
 * separators=(",", ":")) + "\n", in UTF-8): the path JSON-escaped (quote, backslash and the
 * control characters below 0x20, as json's C escaper does), the numbers in decimal, the
 * digest in lowercase hex. `sizes` and `mtimes` are buffers of 8-byte integers (unsigned
 * and signed: the entry table's arrays), `digests` 16 bytes an entry. None when a path is
 * not plain UTF-8 (it holds surrogates: the caller's Python loop encodes it).
 */

static const char hex_digits[] = "0123456789abcdef";

static char *escaped_into(char *out, const char *path, Py_ssize_t length) {
    for (Py_ssize_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        default:
            *out++ = 'u';
            *out++ = '0';
            *out++ = '0';
            *out++ = hex_digits[c >> 4];
            *out++ = hex_digits[c & 15];
        }
    }
    return out;
}

/* Into *total: the sum over `paths` (a list) of `scale` times each path's UTF-8 length, plus
 * `extra`. 1; 0 when a path holds surrogates (the caller answers None: its Python loop
 * encodes them); -1 with an exception set (`what`, the caller, names it) for a path that is
 * not a str or is 4 GiB long. */
static int utf8_sizes(PyObject *paths, const char *what, size_t scale, size_t extra, size_t *total) {
    *total = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths); i++) {
        PyObject *path = PyList_GET_ITEM(paths, i);
        if (!PyUnicode_Check(path)) {
            PyErr_Format(PyExc_TypeError, "%s: paths must be str", what);
            return -1;
        }
        Py_ssize_t length;
        if (PyUnicode_AsUTF8AndSize(path, &length) == NULL) {
            PyErr_Clear();
            return 0;
        }
        if ((unsigned long long)length > 0xffffffffULL) {
            PyErr_Format(PyExc_ValueError, "%s: a path of 4 GiB or more", what);
            return -1;
        }
        *total += scale * (size_t)length + extra;
    }
    return 1;
}

static PyObject *entry_lines(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths;
    Py_buffer sizes = {0}, mtimes = {0}, digests = {0};
    PyObject *result = NULL;
    char *buffer = NULL;
    if (!PyArg_ParseTuple(args, "O!y*y*y*", &PyList_Type, &paths, &sizes, &mtimes, &digests)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(paths);
    if (sizes.len != 8 * count || mtimes.len != 8 * count || digests.len != 16 * count) {
        PyErr_SetString(PyExc_ValueError, "entry_lines: 8 bytes of size and of mtime, 16 of digest, an entry");
        goto done;
    }
    size_t cap; /* escapes at most 6x; brackets, quotes, numbers, digest */
    int sized = utf8_sizes(paths, "entry_lines", 6, 96, &cap);
    if (sized <= 0) {
        if (sized == 0) result = Py_NewRef(Py_None);
        goto done;
    }
    buffer = PyMem_Malloc(cap ? cap : 1);
    if (buffer == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    char *out = buffer;
    const unsigned long long *size = sizes.buf;
    const long long *mtime = mtimes.buf;
    const unsigned char *digest = digests.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t length;
        const char *path = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(paths, i), &length);
        *out++ = '[';
        *out++ = '"';
        out = escaped_into(out, path, length);
        out += sprintf(out, "\",%llu,%lld,\"", size[i], mtime[i]);
        for (int b = 0; b < 16; b++) {
            *out++ = hex_digits[digest[16 * i + b] >> 4];
            *out++ = hex_digits[digest[16 * i + b] & 15];
        }
        *out++ = '"';
        *out++ = ']';
        *out++ = '\n';
    }
    result = PyBytes_FromStringAndSize(buffer, out - buffer);
done:
    PyMem_Free(buffer);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&mtimes);
    PyBuffer_Release(&digests);
    return result;
}

/* digest_records(paths, sizes, digests) -> bytes | None
 *
 * The entries' canonical digest records, byte for byte what
 * dsagent.format.entries.EntryTable.record_blocks joins in Python: per entry b"F", the
 * UTF-8 path's length as a u32 little-endian, the path, the size as a u64 little-endian and
 * the 16 digest bytes. `sizes` is a buffer of 8-byte unsigned integers, `digests` 16 bytes
 * an entry. None when a path is not plain UTF-8 (the Python loop encodes its surrogates).
 */
static PyObject *digest_records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths;
    Py_buffer sizes = {0}, digests = {0};
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "O!y*y*", &PyList_Type, &paths, &sizes, &digests)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(paths);
    if (sizes.len != 8 * count || digests.len != 16 * count) {
        PyErr_SetString(PyExc_ValueError, "digest_records: 8 bytes of size and 16 of digest, an entry");
        goto done;
    }
    size_t total; /* b"F", the length, the path, the size, the digest */
    int sized = utf8_sizes(paths, "digest_records", 1, 1 + 4 + 8 + 16, &total);
    if (sized <= 0) {
        if (sized == 0) result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    const unsigned long long *size = sizes.buf;
    const unsigned char *digest = digests.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t length;
        const char *path = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(paths, i), &length);
        *out++ = 'F';
        for (int b = 0; b < 4; b++) *out++ = (unsigned char)((unsigned long long)length >> (8 * b));
        memcpy(out, path, (size_t)length);
        out += length;
        for (int b = 0; b < 8; b++) *out++ = (unsigned char)(size[i] >> (8 * b));
        memcpy(out, digest + 16 * i, 16);
        out += 16;
    }
done:
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&digests);
    return result;
}
