/* The manifest's entry lines written and read, and the entries' digest records (included by
 * dsnative.c).
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

/* entry_columns(lines) -> (paths, sizes, mtimes, digests) | None
 *
 * A batch of a manifest's entry lines (a list of bytes, each one line without its newline)
 * parsed in one pass, when every line is in the form entry_lines writes and needs no JSON
 * escape: ["PATH",SIZE,MTIME,"DIGEST"], PATH's bytes none of '"', '\\' or below 0x20, SIZE
 * digits and MTIME an optional '-' and digits (no leading zero, at most 19 digits, an mtime
 * within int64 and not "-0"), DIGEST 32 lowercase hex digits, nothing else on the line.
 * paths: a list of str, each decoded as the Python parse decodes it (UTF-8, bytes that are
 * not as surrogates);
 * sizes and mtimes: 8 native bytes an entry (array('Q') and array('q')); digests: 16 raw
 * bytes an entry. None when any line is in another form: the caller's json path parses the
 * whole batch (its values, its errors), so what this accepts is a subset of what json reads,
 * with the same values (tests/dsagent/format/test_native_pack.py checks both on random
 * and mutated lines).
 */

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The decimal number at p (at most 19 digits, no leading zero but "0") into *value; the
 * position after it, or NULL. */
static const char *plain_number(const char *p, const char *end, unsigned long long *value) {
    const char *start = p;
    unsigned long long n = 0; /* 19 digits stay below 2^64 */
    while (p < end && *p >= '0' && *p <= '9' && p - start < 20) n = n * 10 + (unsigned long long)(*p++ - '0');
    Py_ssize_t digits = p - start;
    if (digits == 0 || digits > 19 || (digits > 1 && *start == '0')) return NULL;
    *value = n;
    return p;
}

/* One line into the columns; 1 parsed, 0 not in the plain form, -1 with an exception set. */
static int plain_entry(const char *p, Py_ssize_t length, PyObject *paths, unsigned long long *size,
                       long long *mtime, unsigned char *digest) {
    const char *end = p + length;
    if (length < 2 || p[0] != '[' || p[1] != '"') return 0;
    p += 2;
    const char *path = p;
    while (p < end && *p != '"') {
        unsigned char c = (unsigned char)*p++;
        if (c < 0x20 || c == '\\') return 0;
    }
    if (p == end) return 0;
    Py_ssize_t path_length = p - path;
    p++; /* the closing quote */
    if (p >= end || *p++ != ',') return 0;
    unsigned long long number;
    if ((p = plain_number(p, end, &number)) == NULL) return 0;
    *size = number;
    if (p >= end || *p++ != ',') return 0;
    int negative = p < end && *p == '-';
    if (negative) p++;
    if ((p = plain_number(p, end, &number)) == NULL || number > (unsigned long long)LLONG_MAX || (negative && !number))
        return 0;
    *mtime = negative ? -(long long)number : (long long)number;
    if (end - p != 2 + 32 + 2 || p[0] != ',' || p[1] != '"' || p[34] != '"' || p[35] != ']') return 0;
    for (int b = 0; b < 16; b++) {
        int high = hex_value((unsigned char)p[2 + 2 * b]), low = hex_value((unsigned char)p[3 + 2 * b]);
        if (high < 0 || low < 0) return 0;
        digest[b] = (unsigned char)(high << 4 | low);
    }
    PyObject *text = PyUnicode_DecodeUTF8(path, path_length, "surrogateescape");
    if (text == NULL) return -1;
    int failed = PyList_Append(paths, text);
    Py_DECREF(text);
    return failed ? -1 : 1;
}

static PyObject *entry_columns(PyObject *self, PyObject *lines) {
    (void)self;
    if (!PyList_Check(lines)) {
        PyErr_SetString(PyExc_TypeError, "entry_columns: lines must be a list of bytes");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(lines);
    PyObject *paths = PyList_New(0);
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, 8 * count);
    PyObject *mtimes = PyBytes_FromStringAndSize(NULL, 8 * count);
    PyObject *digests = PyBytes_FromStringAndSize(NULL, 16 * count);
    PyObject *result = NULL;
    if (paths == NULL || sizes == NULL || mtimes == NULL || digests == NULL) goto done;
    unsigned long long *size = (unsigned long long *)PyBytes_AS_STRING(sizes);
    long long *mtime = (long long *)PyBytes_AS_STRING(mtimes);
    unsigned char *digest = (unsigned char *)PyBytes_AS_STRING(digests);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (!PyBytes_Check(line)) {
            PyErr_SetString(PyExc_TypeError, "entry_columns: lines must be a list of bytes");
            goto done;
        }
        int parsed = plain_entry(PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), paths, size + i, mtime + i,
                                 digest + 16 * i);
        if (parsed < 0) goto done;
        if (parsed == 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = PyTuple_Pack(4, paths, sizes, mtimes, digests);
done:
    Py_XDECREF(paths);
    Py_XDECREF(sizes);
    Py_XDECREF(mtimes);
    Py_XDECREF(digests);
    return result;
}
