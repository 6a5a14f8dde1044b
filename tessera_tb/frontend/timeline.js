// Operator timeline (placeholder until the timeline analysis lands).
import { note } from "./dom.js";

export async function renderTimeline(box, ctx) {
  box.replaceChildren(note("info", "timeline"));
}
