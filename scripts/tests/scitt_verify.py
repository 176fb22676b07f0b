"""An independent verifier of ephem-batch's SCITT transparent statements (docs/protocol.md §8.13).

Written from the public drafts only (draft-ietf-cose-merkle-tree-proofs-18, draft-ietf-scitt-architecture-22)
and RFC 9162 §2.1.3.2, on PyPI's pycose (COSE) and cbor2: it shares no code with the Rust verifier.

    python scitt_verify.py STATEMENT.cbor PUBLIC_KEY_HEX     verify one statement (exit 0 / 1)
    python scitt_verify.py --vector VECTOR.json              the known-answer vector and its tamperings
"""

import hashlib
import json
import sys

import cbor2
from pycose.keys import OKPKey
from pycose.keys.curves import Ed25519
from pycose.messages import Sign1Message

RECEIPTS, VDS, VDP, RFC9162_SHA256, INCLUSION = 394, 395, 396, 1, -1
ALG, KID, CWT_CLAIMS, EDDSA = 1, 4, 15, -8


class Invalid(Exception):
    pass


def node(left, right):
    return hashlib.sha256(b"\x01" + left + right).digest()


def root_from_inclusion(index, size, leaf, path):
    """RFC 9162 §2.1.3.2, step by step."""
    if index >= size:
        raise Invalid("inclusion: leaf index beyond the tree")
    fn, sn, r = index, size - 1, hashlib.sha256(b"\x00" + leaf).digest()
    for p in path:
        if sn == 0:
            raise Invalid("inclusion: path too long")
        if fn & 1 or fn == sn:
            r = node(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise Invalid("inclusion: path too short")
    return r


def verify(statement, public_key):
    """Returns (leaf_index, tree_size, root, claims) or raises Invalid naming the check."""
    outer = cbor2.loads(statement)
    if not isinstance(outer, cbor2.CBORTag) or outer.tag != 18 or len(outer.value) != 4:
        raise Invalid("statement: not a tagged COSE_Sign1")
    protected, unprotected, payload, signature = outer.value
    if set(unprotected) != {RECEIPTS} or len(unprotected[RECEIPTS]) != 1:
        raise Invalid("statement: unprotected header is not {394: [receipt]}")
    # The leaf is the signed statement as registered: its unprotected header empty.
    leaf = cbor2.dumps(cbor2.CBORTag(18, [protected, {}, payload, signature]))

    receipt = unprotected[RECEIPTS][0]
    inner = cbor2.loads(receipt)
    phdr = cbor2.loads(inner.value[0])
    if phdr.get(VDS) != RFC9162_SHA256 or phdr.get(ALG) != EDDSA:
        raise Invalid("cose_receipt: not an EdDSA RFC9162_SHA256 receipt")
    claims = phdr.get(CWT_CLAIMS, {})
    if not isinstance(claims.get(1), str) or not isinstance(claims.get(2), str):
        raise Invalid("cose_receipt: CWT claims iss and sub are required")
    if inner.value[2] is not None:
        raise Invalid("cose_receipt: payload is not detached")
    proofs = inner.value[1][VDP][INCLUSION]
    if len(proofs) != 1:
        raise Invalid("inclusion_proof: expected one inclusion proof")
    size, index, path = cbor2.loads(proofs[0])
    if any(len(p) != 32 for p in path):
        raise Invalid("inclusion_proof: path element is not 32 bytes")
    root = root_from_inclusion(index, size, leaf, path)

    msg = Sign1Message.decode(receipt)
    msg.payload = root  # detached: the signature is over the recomputed root
    msg.key = OKPKey(crv=Ed25519, x=public_key)
    try:
        ok = msg.verify_signature()
    except Exception as e:  # pycose raises on malformed signatures
        raise Invalid(f"cose_receipt_signature: {e}") from e
    if not ok:
        raise Invalid("cose_receipt_signature: does not verify over the recomputed root")
    return index, size, root, claims


def flip(data, at):
    b = bytearray(data)
    b[at] ^= 0x01
    return bytes(b)


def check_vector(path):
    v = json.load(open(path))
    statement = bytes.fromhex(v["transparent_statement"])
    key = bytes.fromhex(v["ledger_public_key"])
    index, size, root, claims = verify(statement, key)
    assert (index, size, root.hex()) == (v["leaf_index"], v["tree_size"], v["root"]), (index, size, root.hex())
    assert claims[1] == v["ledger_key"].split("+")[0], claims
    stripped = cbor2.loads(statement)
    assert cbor2.dumps(cbor2.CBORTag(18, [*stripped.value[:1], {}, *stripped.value[2:]])) == bytes.fromhex(v["statement"])
    receipt = bytes.fromhex(v["cose_receipt"])
    at = statement.index(receipt)
    # Tamperings: a path byte, the leaf index, the statement's payload, the signature, another key.
    inner = cbor2.loads(receipt)
    proof = cbor2.loads(inner.value[1][VDP][INCLUSION][0])
    cases = {
        "path": statement.index(proof[2][0]) + 5,
        "signature": at + len(receipt) - 3,
        "payload": statement.index(b"scitt-statement"),
    }
    for name, offset in cases.items():
        try:
            verify(flip(statement, offset), key)
        except (Invalid, Exception):
            continue
        raise AssertionError(f"a flipped bit in the {name} verified")
    bad_index = cbor2.dumps([proof[0], proof[1] ^ 1, proof[2]])
    inner.value[1][VDP][INCLUSION][0] = bad_index
    tampered = cbor2.loads(statement)
    tampered.value[1][RECEIPTS][0] = cbor2.dumps(inner)
    try:
        verify(cbor2.dumps(tampered), key)
        raise AssertionError("another leaf index verified")
    except Invalid as e:
        assert str(e).startswith("cose_receipt_signature"), e
    try:
        verify(statement, flip(key, 0))
        raise AssertionError("another ledger key verified")
    except Invalid:
        pass
    print(f"scitt: vector verified (leaf {index} of {size}, root {root.hex()[:16]}…); tamperings refused")


def main(argv):
    if argv[1:2] == ["--vector"]:
        check_vector(argv[2])
        return 0
    try:
        index, size, root, claims = verify(open(argv[1], "rb").read(), bytes.fromhex(argv[2]))
    except Invalid as e:
        print(f"invalid: {e}", file=sys.stderr)
        return 1
    print(f"valid: leaf {index} of {size}, root {root.hex()}, iss {claims[1]}, sub {claims[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
