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
    function start(event) {
      if (event && event.type === "keydown") shortcut(event);
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
    // Not passive: a shortcut key is claimed (preventDefault) as Material claims it.
    EVENTS.forEach(function (type) {
      window.addEventListener(type, start, { capture: true, passive: type !== "keydown" });
    });
    // A page opened from a search result (?h=term) highlights the term: that reader is
    // searching already.
    if (/[?&]h=/.test(location.search)) start();
  }

  // 1b. The first key press. The key that starts the bundle reaches no handler of the
  // bundle's (it is not loaded yet), so a keyboard reader's first shortcut would do
  // nothing. Material's global shortcuts are done here, as the bundle does them (its
  // keyboard$ in material/.../keyboard and the search and navigation handlers), for the
  // keys pressed before it has started; from then on the bundle handles every key, so
  // no key is acted on twice. Search: open it and put the focus in the field (what the
  // reader types next goes there; the bundle reads the field's value when its search
  // worker is ready). Previous / next page: follow the page's link rel=prev / rel=next.
  function editable(el) {
    if (!el) return false;
    if (el.isContentEditable) return true;
    if (el instanceof HTMLInputElement) return !/^(checkbox|radio|button|submit|reset)$/.test(el.type);
    return el instanceof HTMLTextAreaElement || el instanceof HTMLSelectElement;
  }
  function shortcut(event) {
    if (window.component$ || event.defaultPrevented || event.isComposing) return;
    if (event.metaKey || event.ctrlKey || event.altKey) return;
    if (editable(document.activeElement)) return;
    var key = event.key;
    if (key === "/" || key === "s" || key === "f") {
      var toggle = document.querySelector("input[data-md-toggle=search]");
      var query = document.querySelector("input[data-md-component=search-query]");
      if (!toggle || !query) return;
      event.preventDefault(); // the key names the action; it is not typed into the field
      if (!toggle.checked) toggle.click();
      query.focus();
      query.select();
    } else if (key === "p" || key === "," || key === "n" || key === ".") {
      var link = document.querySelector(key === "p" || key === "," ? "link[rel=prev]" : "link[rel=next]");
      if (!link) return;
      event.preventDefault();
      location.href = link.href;
    }
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
