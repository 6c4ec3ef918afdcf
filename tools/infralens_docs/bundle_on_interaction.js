// Material's bundle, started by the reader's first interaction. Inlined by
// hooks.on_post_page in place of the bundle's <script> tag; the inline <script> carries
// the bundle's URL in data-bundle.
//
// Every page is complete HTML and CSS: text, figures, math, links, the navigation
// drawer and the search toggle (CSS checkboxes), content tabs and details all work with
// no script. What the bundle adds (instant navigation, search, copy buttons, the
// header's section title) starts when the reader first moves the pointer, touches,
// scrolls, presses a key or moves focus. The bundle's start-up was the only long task
// of a page load (~300 ms under Lighthouse's mobile CPU), so a reader who opens a page
// to read it no longer waits for script they have not used yet.
//
// The one thing the bundle did at load that a reader sees is the colour scheme; it is
// done here instead, as Material does it (material/.../palette, `us` and `li` in the
// bundle): the saved palette or, with none saved, the one whose media query matches,
// so a dark-mode reader gets the dark scheme at once; its toggle is shown; and a toggle
// clicked before the bundle has started is applied and saved as Material saves it.
(function () {
  "use strict";
  var script = document.currentScript;
  var bundle = script && script.getAttribute("data-bundle");

  // 1. The bundle (first: nothing below may keep it from loading).
  if (bundle) {
    var EVENTS = ["pointerdown", "pointermove", "touchstart", "keydown", "focusin", "wheel", "scroll"];
    var started = false;
    function start() {
      if (started) return;
      started = true;
      EVENTS.forEach(function (type) {
        window.removeEventListener(type, start, true);
      });
      var tag = document.createElement("script");
      tag.src = bundle;
      tag.onload = function () {
        // The bundle sets itself up on DOMContentLoaded, which fired before the reader
        // could interact: announce it again for the bundle.
        if (document.readyState !== "loading") {
          document.dispatchEvent(new Event("DOMContentLoaded"));
        }
      };
      document.body.appendChild(tag);
    }
    EVENTS.forEach(function (type) {
      window.addEventListener(type, start, { capture: true, passive: true });
    });
    // A page opened from a search result (?h=term) highlights the term: that reader is
    // searching already.
    if (/[?&]h=/.test(location.search)) start();
  }

  // 2. The palette.
  var inputs = Array.prototype.slice.call(
    document.querySelectorAll("[data-md-component=palette] input[name=__palette]")
  );
  function applyPalette(index) {
    var input = inputs[index];
    var color = {};
    input.checked = true;
    ["media", "scheme", "primary", "accent"].forEach(function (key) {
      color[key] = input.getAttribute("data-md-color-" + key);
      document.body.setAttribute("data-md-color-" + key, color[key]);
    });
    inputs.forEach(function (other, i) {
      var label = other.nextElementSibling;
      if (label instanceof HTMLElement) label.hidden = i !== index;
    });
    __md_set("__palette", { index: index, color: color });
  }
  if (inputs.length) {
    var saved = null;
    try {
      saved = __md_get("__palette");
    } catch (error) {
      // storage unreadable (a browser setting): as if nothing were saved
    }
    var index =
      saved && typeof saved.index === "number"
        ? saved.index
        : inputs.findIndex(function (input) {
            return matchMedia(input.getAttribute("data-md-color-media")).matches;
          });
    applyPalette(Math.max(0, Math.min(index, inputs.length - 1)));
    inputs.forEach(function (input, i) {
      input.addEventListener("change", function () {
        // once the bundle has started, it does this itself
        if (!window.component$) applyPalette(i);
      });
    });
  }
})();
