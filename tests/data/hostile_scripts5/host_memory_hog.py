# grabs host memory in 64 MiB chunks up to 50 GiB, more than most machines have: given no
# --max-host-memory, it took the machine (run it only under a cap)
chunks = []
for _ in range(800):
    chunks.append(bytearray(64 * 2**20))
print("held", len(chunks))
