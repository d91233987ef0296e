/* The samples a pack judges its blocks by (included by dsnative.c).
 *
 * block_samples(buffer, block, pieces, piece) -> bytes
 *
 * For each block of `block` bytes of `buffer` (the last one shorter), its sample, one after
 * the other: `pieces` pieces of `piece` bytes spread evenly over the block (the first at
 * its start, the last at its end, `(length - piece) // (pieces - 1)` bytes apart), or the
 * whole block when it is no longer than pieces * piece bytes. Byte for byte the samples
 * dsagent.format.frames cuts in Python, for a whole buffer in one call: there, 64 slices
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
