/*
 * prelude_images.js: a cell's image helpers, `image` and `generatedImage` (design.md,
 * runtime 3). Most cells never show an image, and reading these functions in every cell's
 * prelude was 8 % of a trivial cell's work in the engine, so the binding reads this script only
 * when a cell first calls one of the two (the prelude's `imageHelpers`), once per cell.
 *
 * The script yields a function that takes the prelude's kit and returns {image, generatedImage}.
 *
 * Rules:
 * 1. This script runs after cell code, which may have replaced any builtin by then: it reads no
 *    global, and gets every builtin it uses from the kit, captured by the prelude before any
 *    cell code ran. It takes arrays apart by index, not by destructuring (which would call the
 *    cell's `Array.prototype[Symbol.iterator]`).
 * 2. Validation errors are thrown as plain strings with the reference's exact texts (3.3).
 */
(function makeImageHelpers(kit) {
  "use strict";

  const { apply, stringify, parseJson, isArray, toLowerCase, sliceString, debugQuote, native } = kit;

  const IMAGE_DETAILS = ["auto", "low", "high", "original"];
  const IMAGE_GENERIC_ERROR =
    "image expects a non-empty image URL string, an object with image_url and optional detail, or a raw MCP image block";
  const REMOTE_IMAGE_ERROR =
    "Tool call failed: remote image URLs are not supported in tool outputs. Pass a base64 data URI instead";
  const DETAIL_TYPE_ERROR = "image detail must be a string when provided";

  const lowerPrefix = (value, length) => apply(toLowerCase, apply(sliceString, value, [0, length]), []);

  function isImageDetail(value) {
    for (let i = 0; i < IMAGE_DETAILS.length; i++) if (IMAGE_DETAILS[i] === value) return true;
    return false;
  }

  function imageFromObject(item) {
    const url = item.image_url;
    if (typeof url !== "string") throw IMAGE_GENERIC_ERROR;
    const detail = item.detail;
    if (detail === null || detail === undefined) return [url, undefined];
    if (typeof detail !== "string") throw DETAIL_TYPE_ERROR;
    return [url, detail];
  }

  function imageFromMcpBlock(item) {
    let block;
    try {
      block = parseJson(stringify(item));
    } catch {
      throw IMAGE_GENERIC_ERROR;
    }
    if (block === null || typeof block !== "object" || isArray(block)) throw IMAGE_GENERIC_ERROR;
    if (typeof block.type !== "string") throw IMAGE_GENERIC_ERROR;
    if (block.type !== "image") {
      throw `image only accepts MCP image blocks, got ${debugQuote(block.type)}`;
    }
    const data = block.data;
    if (typeof data !== "string" || data === "") throw "image expected MCP image data";
    let url = data;
    if (lowerPrefix(data, 5) !== "data:") {
      let mime = "application/octet-stream";
      if (typeof block.mimeType === "string" && block.mimeType !== "") mime = block.mimeType;
      else if (typeof block.mime_type === "string" && block.mime_type !== "") {
        mime = block.mime_type;
      }
      url = `data:${mime};base64,${data}`;
    }
    const meta = block._meta;
    let detail;
    if (meta !== null && typeof meta === "object" && !isArray(meta)) {
      const requested = meta["codex/imageDetail"];
      if (isImageDetail(requested)) detail = requested;
    }
    return [url, detail];
  }

  // Section 3.5, steps 2 to 4: [the image URL, its detail] of an image helper's argument.
  function imageItem(item, override) {
    let url, embedded;
    if (typeof item === "string") {
      url = item;
    } else if (item !== null && typeof item === "object" && !isArray(item)) {
      const found = item.image_url !== undefined ? imageFromObject(item) : imageFromMcpBlock(item);
      url = found[0];
      embedded = found[1];
    } else {
      throw IMAGE_GENERIC_ERROR;
    }
    if (url === "") throw IMAGE_GENERIC_ERROR;
    if (lowerPrefix(url, 7) === "http://" || lowerPrefix(url, 8) === "https://") {
      throw REMOTE_IMAGE_ERROR;
    }
    const requested = override !== undefined ? override : embedded;
    let detail = "high";
    if (requested !== undefined) {
      detail = apply(toLowerCase, requested, []);
      if (!isImageDetail(detail)) {
        throw "image detail must be one of: auto, low, high, original";
      }
    }
    return [url, detail];
  }

  // `image(imageUrlOrItem, detail)`; the prelude passes how many arguments the cell gave.
  function image(count, imageUrlOrItem, detail) {
    let override;
    if (count >= 2 && detail !== null && detail !== undefined) {
      if (typeof detail !== "string") throw DETAIL_TYPE_ERROR;
      override = detail;
    }
    const found = imageItem(imageUrlOrItem, override);
    native.image(found[0], found[1]);
  }

  function generatedImage(result) {
    if (result === null || typeof result !== "object") {
      throw "generatedImage expects an image generation result object";
    }
    const hint = result.output_hint;
    if (hint !== undefined && typeof hint !== "string") {
      throw "generatedImage output_hint must be a string when provided";
    }
    const found = imageItem(result, undefined);
    native.image(found[0], found[1]);
    if (hint !== undefined) native.text(hint);
  }

  return { image, generatedImage };
});
