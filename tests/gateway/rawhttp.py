"""HTTP/1.1 written byte for byte, for requests no client library would send (non-ASCII header values,
malformed framing, oversized lines)."""

from __future__ import annotations

import asyncio


async def send_raw(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """``data`` written to 127.0.0.1:``port`` as it is; the answer's status, headers (lower-case names)
    and body, read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    return int(lines[0].split()[1]), headers, payload
