"""attention-gym / gpt-fast style: flex_attention and create_block_mask compiled at module level,
a document mask (and_masks with causal) over a document-id tensor on the device, ALiBi as the
score_mod, the BlockMask built once and reused by every step."""

import torch
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

flex_attention = torch.compile(flex_attention, dynamic=False)
create_block_mask = torch.compile(create_block_mask)

B, H, M, D = 2, 4, 512, 16
document_id = (torch.arange(M) // 200).cuda()
slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32) * 8 / H).cuda()


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def same_document(b, h, q_idx, kv_idx):
    return document_id[q_idx] == document_id[kv_idx]


def alibi(score, b, h, q_idx, kv_idx):
    return score + slopes[h] * (kv_idx - q_idx)


qkv = torch.nn.Linear(H * D, 3 * H * D).cuda()
optimizer = torch.optim.AdamW(qkv.parameters(), lr=1e-3)
block_mask = create_block_mask(and_masks(causal, same_document), B, H, M, M, device="cuda")
for _ in range(3):
    x = torch.randn(B, M, H * D, device="cuda")
    q, k, v = qkv(x).view(B, M, 3, H, D).permute(2, 0, 3, 1, 4)
    flex_attention(q, k, v, score_mod=alibi, block_mask=block_mask).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
