# grabs host memory in 16 MiB chunks up to 3 GiB (run under --max-host-memory)
chunks = []
for _ in range(192):
    chunks.append(bytearray(16 * 2**20))
print("held", len(chunks))
