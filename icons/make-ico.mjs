// Writes a Windows .ico that embeds PNG images (allowed since Vista), so no image library is needed.
// Usage: node make-ico.mjs OUT.ico A.png B.png ...
import { readFileSync, writeFileSync } from "node:fs";

const [out, ...inputs] = process.argv.slice(2);
const pngs = inputs.map((p) => readFileSync(p));
const header = Buffer.alloc(6);
header.writeUInt16LE(0, 0); // reserved
header.writeUInt16LE(1, 2); // type: icon
header.writeUInt16LE(pngs.length, 4);
let offset = 6 + 16 * pngs.length;
const entries = pngs.map((png) => {
  // The PNG's IHDR holds width and height as big-endian u32 at bytes 16 and 20.
  const w = png.readUInt32BE(16);
  const h = png.readUInt32BE(20);
  const e = Buffer.alloc(16);
  e.writeUInt8(w >= 256 ? 0 : w, 0);
  e.writeUInt8(h >= 256 ? 0 : h, 1);
  e.writeUInt8(0, 2); // palette size
  e.writeUInt8(0, 3); // reserved
  e.writeUInt16LE(1, 4); // colour planes
  e.writeUInt16LE(32, 6); // bits per pixel
  e.writeUInt32LE(png.length, 8);
  e.writeUInt32LE(offset, 12);
  offset += png.length;
  return e;
});
writeFileSync(out, Buffer.concat([header, ...entries, ...pngs]));
