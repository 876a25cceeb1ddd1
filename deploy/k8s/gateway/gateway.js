// The gateway's two per-request decisions (nginx.conf): may the client in, and which key TorchServe wants.
import crypto from 'crypto';
import fs from 'fs';

const KEY_FILE = process.env.TORCHSERVE_KEY_FILE || '/keys/key_file.json';

function digest(text) {
    return crypto.createHash('sha256').update(text).digest('hex');
}

// Digests of equal length are compared, so the time taken does not tell how much of a guess was right.
function clientAllowed(r) {
    const expected = process.env.CLIENT_TOKEN || '';
    const header = r.headersIn.Authorization || '';
    if (expected.length < 16 || !header.startsWith('Bearer ')) {
        return '0';
    }
    return digest(header.slice(7)) === digest(expected) ? '1' : '0';
}

// TorchServe rewrites key_file.json at start-up and when a key is rotated, so it is read on each request
// (a few hundred bytes from a memory-backed volume).
function torchserveAuthorization(r) {
    try {
        return 'Bearer ' + JSON.parse(fs.readFileSync(KEY_FILE, 'utf8')).inference.key;
    } catch (e) {
        r.error(`no inference key in ${KEY_FILE}: ${e}`);
        return '';
    }
}

export default { clientAllowed, torchserveAuthorization };
