"""DETR's SetCriterion: Hungarian matching of queries to boxes, then CE + L1 + GIoU losses (aux losses per layer).

Source: facebookresearch/detr. engine.py (commit ee75d89981926db2d794aa162ef85196675cdad9), train_one_epoch:
`outputs = model(samples)`, `loss_dict = criterion(outputs, targets)`, `weight_dict = criterion.weight_dict`,
`losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict.keys() if k in weight_dict)`, the reduced dict's
`.item()`, `optimizer.zero_grad()`, `losses.backward()`, `clip_grad_norm_(model.parameters(), max_norm)`,
`optimizer.step()`. models/detr.py (commit e42a3b174d2325c28f82d7114138c755ac7c095a): SetCriterion (the
`empty_weight` buffer, loss_labels with `target_classes[idx] = target_classes_o` and class_error under no_grad,
loss_cardinality under no_grad, loss_boxes L1 + GIoU, aux_outputs matched again per decoder layer) and the
`_set_aux_loss` output. models/matcher.py (commit 589107f31fa75a4c07c028700c533d4abc670488): HungarianMatcher
under @torch.no_grad(), cost_class/cost_bbox/cost_giou, `C.view(bs, num_queries, -1).cpu()`, split per image.
util/box_ops.py: box_cxcywh_to_xyxy, generalized_box_iou. Retyped at CPU size: scipy's linear_sum_assignment is
replaced by an exhaustive search over itertools.permutations (same optimum at 5 queries); the backbone and
transformer become a tiny stand-in (a linear encoder of an 8-dim image vector, 5 learned queries refined by two
"decoder layers" of Linear+ReLU, each layer's class and box heads), 3 classes, 2 images with 1-2 boxes,
eos_coef 0.1, weights 1/5/2 and max_norm 0.1 as published, AdamW lr 1e-4 weight_decay 1e-4; the distributed
reduce, the metric logger and the masks are left out.
Written from the published files' structure (engine.py, models/detr.py, models/matcher.py), not checked line
by line against the commits named.
"""

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

ITERATIONS = 3

TRUTH = {
    "error": None,
    "retains": {},
    "carried": [],
    "notes": [],
    "modifies_in_place": [],
}


def box_cxcywh_to_xyxy(x):
    x_c, y_c, w, h = x.unbind(-1)
    b = [(x_c - 0.5 * w), (y_c - 0.5 * h),
         (x_c + 0.5 * w), (y_c + 0.5 * h)]
    return torch.stack(b, dim=-1)


def box_area(boxes):
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1, boxes2):
    area1 = box_area(boxes1)
    area2 = box_area(boxes2)
    lt = torch.max(boxes1[:, None, :2], boxes2[:, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[:, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[:, :, 0] * wh[:, :, 1]
    union = area1[:, None] + area2 - inter
    iou = inter / union
    return iou, union


def generalized_box_iou(boxes1, boxes2):
    assert (boxes1[:, 2:] >= boxes1[:, :2]).all()
    assert (boxes2[:, 2:] >= boxes2[:, :2]).all()
    iou, union = box_iou(boxes1, boxes2)
    lt = torch.min(boxes1[:, None, :2], boxes2[:, :2])
    rb = torch.max(boxes1[:, None, 2:], boxes2[:, 2:])
    wh = (rb - lt).clamp(min=0)
    area = wh[:, :, 0] * wh[:, :, 1]
    return iou - (area - union) / area


def linear_sum_assignment(cost):
    """Stand-in for scipy.optimize.linear_sum_assignment on a small (queries x targets) cost matrix."""
    n_rows, n_cols = cost.shape
    best, best_rows = None, None
    for rows in itertools.permutations(range(n_rows), n_cols):
        total = sum(float(cost[r, c]) for c, r in enumerate(rows))
        if best is None or total < best:
            best, best_rows = total, rows
    pairs = sorted(zip(best_rows, range(n_cols)))
    return [p[0] for p in pairs], [p[1] for p in pairs]


class HungarianMatcher(nn.Module):
    def __init__(self, cost_class: float = 1, cost_bbox: float = 1, cost_giou: float = 1):
        super().__init__()
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou

    @torch.no_grad()
    def forward(self, outputs, targets):
        bs, num_queries = outputs["pred_logits"].shape[:2]
        out_prob = outputs["pred_logits"].flatten(0, 1).softmax(-1)
        out_bbox = outputs["pred_boxes"].flatten(0, 1)
        tgt_ids = torch.cat([v["labels"] for v in targets])
        tgt_bbox = torch.cat([v["boxes"] for v in targets])
        cost_class = -out_prob[:, tgt_ids]
        cost_bbox = torch.cdist(out_bbox, tgt_bbox, p=1)
        cost_giou = -generalized_box_iou(box_cxcywh_to_xyxy(out_bbox), box_cxcywh_to_xyxy(tgt_bbox))
        C = self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou
        C = C.view(bs, num_queries, -1).cpu()
        sizes = [len(v["boxes"]) for v in targets]
        indices = [linear_sum_assignment(c[i]) for i, c in enumerate(C.split(sizes, -1))]
        return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in indices]


def accuracy(output, target, topk=(1,)):
    maxk = max(topk)
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    res = []
    for k in topk:
        correct_k = correct[:k].view(-1).float().sum(0)
        res.append(correct_k.mul_(100.0 / batch_size))
    return res


class SetCriterion(nn.Module):
    def __init__(self, num_classes, matcher, weight_dict, eos_coef, losses):
        super().__init__()
        self.num_classes = num_classes
        self.matcher = matcher
        self.weight_dict = weight_dict
        self.eos_coef = eos_coef
        self.losses = losses
        empty_weight = torch.ones(self.num_classes + 1)
        empty_weight[-1] = self.eos_coef
        self.register_buffer('empty_weight', empty_weight)

    def loss_labels(self, outputs, targets, indices, num_boxes, log=True):
        assert 'pred_logits' in outputs
        src_logits = outputs['pred_logits']
        idx = self._get_src_permutation_idx(indices)
        target_classes_o = torch.cat([t["labels"][J] for t, (_, J) in zip(targets, indices)])
        target_classes = torch.full(src_logits.shape[:2], self.num_classes,
                                    dtype=torch.int64, device=src_logits.device)
        target_classes[idx] = target_classes_o
        loss_ce = F.cross_entropy(src_logits.transpose(1, 2), target_classes, self.empty_weight)
        losses = {'loss_ce': loss_ce}
        if log:
            losses['class_error'] = 100 - accuracy(src_logits[idx], target_classes_o)[0]
        return losses

    @torch.no_grad()
    def loss_cardinality(self, outputs, targets, indices, num_boxes):
        pred_logits = outputs['pred_logits']
        device = pred_logits.device
        tgt_lengths = torch.as_tensor([len(v["labels"]) for v in targets], device=device)
        card_pred = (pred_logits.argmax(-1) != pred_logits.shape[-1] - 1).sum(1)
        card_err = F.l1_loss(card_pred.float(), tgt_lengths.float())
        losses = {'cardinality_error': card_err}
        return losses

    def loss_boxes(self, outputs, targets, indices, num_boxes):
        assert 'pred_boxes' in outputs
        idx = self._get_src_permutation_idx(indices)
        src_boxes = outputs['pred_boxes'][idx]
        target_boxes = torch.cat([t['boxes'][i] for t, (_, i) in zip(targets, indices)], dim=0)
        loss_bbox = F.l1_loss(src_boxes, target_boxes, reduction='none')
        losses = {}
        losses['loss_bbox'] = loss_bbox.sum() / num_boxes
        loss_giou = 1 - torch.diag(generalized_box_iou(
            box_cxcywh_to_xyxy(src_boxes),
            box_cxcywh_to_xyxy(target_boxes)))
        losses['loss_giou'] = loss_giou.sum() / num_boxes
        return losses

    def _get_src_permutation_idx(self, indices):
        batch_idx = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
        src_idx = torch.cat([src for (src, _) in indices])
        return batch_idx, src_idx

    def get_loss(self, loss, outputs, targets, indices, num_boxes, **kwargs):
        loss_map = {
            'labels': self.loss_labels,
            'cardinality': self.loss_cardinality,
            'boxes': self.loss_boxes,
        }
        assert loss in loss_map, f'do you really want to compute {loss} loss?'
        return loss_map[loss](outputs, targets, indices, num_boxes, **kwargs)

    def forward(self, outputs, targets):
        outputs_without_aux = {k: v for k, v in outputs.items() if k != 'aux_outputs'}
        indices = self.matcher(outputs_without_aux, targets)
        num_boxes = sum(len(t["labels"]) for t in targets)
        num_boxes = torch.as_tensor([num_boxes], dtype=torch.float, device=next(iter(outputs.values())).device)
        num_boxes = torch.clamp(num_boxes, min=1).item()
        losses = {}
        for loss in self.losses:
            losses.update(self.get_loss(loss, outputs, targets, indices, num_boxes))
        if 'aux_outputs' in outputs:
            for i, aux_outputs in enumerate(outputs['aux_outputs']):
                indices = self.matcher(aux_outputs, targets)
                for loss in self.losses:
                    kwargs = {}
                    if loss == 'labels':
                        kwargs = {'log': False}
                    l_dict = self.get_loss(loss, aux_outputs, targets, indices, num_boxes, **kwargs)
                    l_dict = {k + f'_{i}': v for k, v in l_dict.items()}
                    losses.update(l_dict)
        return losses


class TinyDETR(nn.Module):
    """Stand-in for the backbone + transformer: queries refined by decoder layers, heads on every layer."""

    def __init__(self, num_classes=3, num_queries=5, hidden_dim=8, image_dim=8, dec_layers=2):
        super().__init__()
        self.encoder = nn.Linear(image_dim, hidden_dim)
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.layers = nn.ModuleList(nn.Linear(2 * hidden_dim, hidden_dim) for _ in range(dec_layers))
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.bbox_embed = nn.Linear(hidden_dim, 4)

    def forward(self, samples):
        memory = self.encoder(samples)[:, None, :].expand(-1, self.query_embed.weight.shape[0], -1)
        tgt = self.query_embed.weight[None].expand(samples.shape[0], -1, -1)
        hs = []
        for layer in self.layers:
            tgt = F.relu(layer(torch.cat([tgt, memory], -1)))
            hs.append(tgt)
        hs = torch.stack(hs)
        outputs_class = self.class_embed(hs)
        outputs_coord = self.bbox_embed(hs).sigmoid()
        out = {'pred_logits': outputs_class[-1], 'pred_boxes': outputs_coord[-1]}
        out['aux_outputs'] = self._set_aux_loss(outputs_class, outputs_coord)
        return out

    @torch.jit.unused
    def _set_aux_loss(self, outputs_class, outputs_coord):
        return [{'pred_logits': a, 'pred_boxes': b}
                for a, b in zip(outputs_class[:-1], outputs_coord[:-1])]


def make_targets():
    boxes = [torch.tensor([[0.3, 0.4, 0.2, 0.3]]), torch.tensor([[0.6, 0.5, 0.3, 0.2], [0.2, 0.7, 0.1, 0.2]])]
    labels = [torch.tensor([1]), torch.tensor([0, 2])]
    return [{"boxes": b, "labels": l} for b, l in zip(boxes, labels)]


def build() -> dict:
    torch.manual_seed(42)
    model = TinyDETR()
    matcher = HungarianMatcher(cost_class=1, cost_bbox=5, cost_giou=2)
    weight_dict = {'loss_ce': 1, 'loss_bbox': 5}
    weight_dict['loss_giou'] = 2
    aux_weight_dict = {}
    for i in range(len(model.layers) - 1):
        aux_weight_dict.update({k + f'_{i}': v for k, v in weight_dict.items()})
    weight_dict.update(aux_weight_dict)
    criterion = SetCriterion(3, matcher=matcher, weight_dict=weight_dict, eos_coef=0.1,
                             losses=['labels', 'boxes', 'cardinality'])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    return {"model": model, "criterion": criterion, "optimizer": optimizer, "samples": torch.randn(2, 8),
            "targets": make_targets(), "max_norm": 0.1}


def iteration(state: dict) -> None:
    model, criterion, optimizer = state["model"], state["criterion"], state["optimizer"]
    samples, targets, max_norm = state["samples"], state["targets"], state["max_norm"]
    model.train()
    criterion.train()
    outputs = model(samples)
    loss_dict = criterion(outputs, targets)
    weight_dict = criterion.weight_dict
    losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict.keys() if k in weight_dict)

    loss_dict_reduced = loss_dict
    loss_dict_reduced_scaled = {k: v * weight_dict[k]
                                for k, v in loss_dict_reduced.items() if k in weight_dict}
    losses_reduced_scaled = sum(loss_dict_reduced_scaled.values())
    loss_value = losses_reduced_scaled.item()

    optimizer.zero_grad()
    losses.backward()  # @backward
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()


def run(state: dict, iterations: int = ITERATIONS) -> None:
    for _ in range(iterations):
        iteration(state)


def step_function(state: dict) -> Callable[[], None]:
    return lambda: iteration(state)


if __name__ == "__main__":
    run(build())
