'use strict'
// lib/exposition/gzip.ts: CRC-32 and its combination, and gzip members laid out from deflate fragments, all
// checked against zlib itself. Run `npx tsc -p tsconfig.json` first.
const t = require('tap')
const zlib = require('node:zlib')
const { crc32, crc32Combine, crc32Shift, fragment, pack, MemberBuilder, EMPTY_FRAGMENT } = require('../dist/exposition/gzip.js')
const { prng } = require('./helpers')

const random = prng(1952)
function bytes(length) {
  const out = Buffer.allocUnsafe(length)
  // Text-like, so that deflate finds matches; a few random bytes too.
  for (let i = 0; i < length; i++) out[i] = random() < 0.9 ? 0x61 + ((i * 7) % 13) : Math.floor(random() * 256)
  return out
}
/** The CRC zlib writes into a gzip trailer. */
const zlibCrc = (buffer) => zlib.gzipSync(buffer).readUInt32LE(zlib.gzipSync(buffer).length - 8)

t.test('crc32 matches zlib at every alignment and length', async (t) => {
  // If this failed, every gzip scrape would end in a wrong CRC: clients reject the body.
  const lengths = [0, 1, 2, 7, 8, 9, 15, 16, 17, 255, 1000, 65_537]
  let mismatches = 0
  for (const length of lengths) {
    const buffer = bytes(length)
    if (crc32(buffer) !== zlibCrc(buffer)) mismatches++
    // A slice that starts at an odd offset and continues from a running CRC.
    const cut = Math.floor(length / 3)
    if (crc32(buffer, cut, length, crc32(buffer, 0, cut)) !== zlibCrc(buffer)) mismatches++
  }
  t.equal(mismatches, 0, `${lengths.length} lengths, whole and continued`)
  t.equal(crc32(Buffer.from('123456789')), 0xcbf43926, 'the standard check value')
})

t.test('crc32Combine(crc A, crc B, shift |B|) is the CRC of A followed by B', async (t) => {
  // If this failed, a member laid out from reused fragments would carry a wrong CRC.
  let mismatches = 0
  for (let i = 0; i < 200; i++) {
    const a = bytes(Math.floor(random() * 3000))
    const b = bytes(i % 10 === 0 ? 0 : Math.floor(random() * 70_000))
    const combined = crc32Combine(crc32(a), crc32(b), crc32Shift(b.length))
    if (combined !== crc32(Buffer.concat([a, b]))) mismatches++
  }
  t.equal(mismatches, 0, '200 random pairs, empty second parts included')
  t.equal(crc32Combine(0x12345678, 0, crc32Shift(0)), 0x12345678, 'appending nothing changes nothing')
})

t.test('a member of fragments gunzips to the texts in order, and is one well-formed member', async (t) => {
  // If this failed, a /metrics gzip body would not decompress, or only with lenient decoders
  // (several members, no final block) — Prometheus and curl expect one well-formed member.
  const texts = [bytes(10), Buffer.alloc(0), bytes(100_000), bytes(1), bytes(3000)]
  const member = new MemberBuilder()
  for (const text of texts) member.add(fragment(text))
  const body = member.finish()
  const whole = Buffer.concat(texts)
  t.ok(zlib.gunzipSync(body).equals(whole), 'gunzip gives the concatenated texts')
  // One member exactly: header, one deflate stream that ends in a final block, CRC, ISIZE.
  t.same([...body.subarray(0, 3)], [0x1f, 0x8b, 8], 'gzip magic and deflate')
  t.ok(zlib.inflateRawSync(body.subarray(10, body.length - 8)).equals(whole), 'the deflate stream is complete on its own (a missing final block fails here)')
  t.equal(body.readUInt32LE(body.length - 8), zlibCrc(whole), 'the trailer CRC is the CRC of the whole text')
  t.equal(body.readUInt32LE(body.length - 4), whole.length, 'ISIZE is the text length')
  // Fragments are independent: reused in another order and another member, still exact.
  const parts = texts.map((text) => fragment(text))
  const again = new MemberBuilder()
  for (const k of [2, 0, 4]) again.add(parts[k])
  t.ok(zlib.gunzipSync(again.finish()).equals(Buffer.concat([texts[2], texts[0], texts[4]])), 'fragments combine in any order')
  t.ok(zlib.gunzipSync(new MemberBuilder().finish()).equals(Buffer.alloc(0)), 'a member of no fragments is an empty gzip')
  t.equal(fragment(Buffer.alloc(0)), EMPTY_FRAGMENT, 'an empty text is the empty fragment')
})

t.test('packed fragments: one exact buffer, each fragment still usable on its own', async (t) => {
  // If this failed, the chunk cache would keep 16 KB per fragment alive (~20 MB at 200k samples),
  // or hand out the wrong bytes for a fragment.
  const texts = [bytes(500), Buffer.alloc(0), bytes(40_000), bytes(3)]
  const fragments = texts.map((text) => fragment(text))
  t.ok(fragments[0].bytes.buffer.byteLength > fragments[0].bytes.length, 'zlib hands out a view of a larger buffer (why packing copies)')
  const packed = pack(fragments)
  t.equal(packed.bytes.buffer.byteLength, packed.bytes.length, 'packed: one buffer of exactly the compressed size')
  t.equal(packed.bytes.length, fragments.reduce((n, f) => n + f.bytes.length, 0), 'holding every fragment\'s bytes')
  const member = new MemberBuilder()
  for (const k of [3, 2, 0, 1]) member.addPacked(packed, k)
  t.ok(zlib.gunzipSync(member.finish()).equals(Buffer.concat([texts[3], texts[2], texts[0], texts[1]])), 'fragments taken out of the pack in any order gunzip exactly')
})
